//! Golden-file tests of the report step: every format rendered from the
//! fixed fixtures of `aggregate::test_support` (`server`, `prefork`) and
//! [`super::fixtures`] (`lifecycle`: a reused tgid, an exec, every way an
//! image ends, paths whose three measures differ) with their real diagnosis
//! and compared byte for byte with `tests/data/` (pprof as the `Debug` form
//! of the decoded profile, since gzip bytes depend on the compressor). Run
//! with `MEMTRACE_BLESS=1` to rewrite the files after an intended change,
//! then review their diff.

use std::io::Read;
use std::path::PathBuf;

use flate2::read::GzDecoder;
use prost::Message;

use super::pprof::Profile;
use super::Format;
use super::{render, RenderOptions};
use crate::aggregate::Weight;
use crate::diagnose::Diagnosed;
use crate::report::fixtures::lifecycle_diagnosed;
use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

/// `tests/data/` of the workspace.
fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

/// Compares `actual` with `tests/data/<name>`, or writes it there when
/// `MEMTRACE_BLESS` is set.
pub(crate) fn check_golden(name: &str, actual: &[u8]) {
    let path = data_dir().join(name);
    if std::env::var_os("MEMTRACE_BLESS").is_some() {
        std::fs::create_dir_all(data_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        // A stale `.actual` of an earlier failure would mislead.
        let _ = std::fs::remove_file(data_dir().join(format!("{name}.actual")));
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|err| {
        panic!(
            "cannot read golden file `{}` ({err}); run with MEMTRACE_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        // `<name>.actual`: the extension is kept, so goldens that share a
        // stem (`server.html`, `server.json`) do not overwrite each other.
        let actual_path = data_dir().join(format!("{name}.actual"));
        std::fs::write(&actual_path, actual).unwrap();
        panic!(
            "`{}` differs from the rendered output, written to `{}` \
             (run with MEMTRACE_BLESS=1 if the change is intended)",
            path.display(),
            actual_path.display()
        );
    }
}

fn rendered(report: &Diagnosed, format: Format, options: &RenderOptions) -> Vec<u8> {
    let mut out = Vec::new();
    render(report, format, options, &mut out).unwrap();
    out
}

/// The default options with `weight`.
fn weighed(weight: Weight) -> RenderOptions {
    RenderOptions {
        weight,
        ..RenderOptions::default()
    }
}

#[test]
fn folded() {
    let options = RenderOptions::default();
    check_golden(
        "server.folded",
        &rendered(&server_diagnosed(), Format::Folded, &options),
    );
    let lifecycle = lifecycle_diagnosed();
    check_golden(
        "lifecycle.folded",
        &rendered(&lifecycle, Format::Folded, &options),
    );
    check_golden(
        "lifecycle-grown.folded",
        &rendered(&lifecycle, Format::Folded, &weighed(Weight::Grown)),
    );
}

#[test]
fn flamegraph() {
    let report = server_diagnosed();
    check_golden(
        "server.svg",
        &rendered(&report, Format::Flamegraph, &RenderOptions::default()),
    );
    let inverted = RenderOptions {
        inverted: true,
        ..RenderOptions::default()
    };
    check_golden(
        "prefork-inverted.svg",
        &rendered(&prefork_diagnosed(), Format::Flamegraph, &inverted),
    );
}

#[test]
fn speedscope() {
    check_golden(
        "prefork.speedscope.json",
        &rendered(
            &prefork_diagnosed(),
            Format::Speedscope,
            &RenderOptions::default(),
        ),
    );
    check_golden(
        "lifecycle-end.speedscope.json",
        &rendered(
            &lifecycle_diagnosed(),
            Format::Speedscope,
            &weighed(Weight::End),
        ),
    );
}

#[test]
fn html() {
    let options = RenderOptions::default();
    check_golden(
        "server.html",
        &rendered(&server_diagnosed(), Format::Html, &options),
    );
    check_golden(
        "lifecycle.html",
        &rendered(&lifecycle_diagnosed(), Format::Html, &options),
    );
}

#[test]
fn table() {
    let options = RenderOptions::default();
    check_golden(
        "server.txt",
        &rendered(&server_diagnosed(), Format::Table, &options),
    );
    check_golden(
        "prefork.txt",
        &rendered(&prefork_diagnosed(), Format::Table, &options),
    );
    check_golden(
        "lifecycle.txt",
        &rendered(&lifecycle_diagnosed(), Format::Table, &options),
    );
}

#[test]
fn json() {
    let options = RenderOptions::default();
    check_golden(
        "server.json",
        &rendered(&server_diagnosed(), Format::Json, &options),
    );
    check_golden(
        "lifecycle.json",
        &rendered(&lifecycle_diagnosed(), Format::Json, &options),
    );
}

/// The decoded profile of `report`, as `Debug` text.
fn pprof_text(report: &Diagnosed, options: &RenderOptions) -> Vec<u8> {
    let gzipped = rendered(report, Format::Pprof, options);
    let mut encoded = Vec::new();
    GzDecoder::new(gzipped.as_slice())
        .read_to_end(&mut encoded)
        .unwrap();
    let profile = Profile::decode(encoded.as_slice()).unwrap();
    format!("{profile:#?}\n").into_bytes()
}

#[test]
fn pprof() {
    check_golden(
        "server.pprof.txt",
        &pprof_text(&server_diagnosed(), &RenderOptions::default()),
    );
    check_golden(
        "lifecycle-grown.pprof.txt",
        &pprof_text(&lifecycle_diagnosed(), &weighed(Weight::Grown)),
    );
}

/// The golden check fails on a changed byte and leaves the output beside
/// the golden file.
#[test]
fn a_changed_output_fails_the_check() {
    if std::env::var_os("MEMTRACE_BLESS").is_some() {
        return;
    }
    let mut out = rendered(
        &server_diagnosed(),
        Format::Folded,
        &RenderOptions::default(),
    );
    out[0] ^= 1;
    let failed = std::panic::catch_unwind(|| check_golden("server.folded", &out));
    let actual = data_dir().join("server.folded.actual");
    let written = std::fs::read(&actual);
    let _ = std::fs::remove_file(&actual);
    assert!(failed.is_err(), "a changed byte passed the golden check");
    assert_eq!(written.unwrap(), out);
}
