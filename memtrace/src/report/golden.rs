//! Golden-file tests of the report step: every format rendered from the
//! fixed fixtures of `aggregate::test_support` with their real diagnosis and
//! compared byte for byte with `tests/data/` (pprof as the `Debug` form of
//! the decoded profile, since gzip bytes depend on the compressor). Run with `MEMTRACE_BLESS=1` to
//! rewrite the files after an intended change, then review their diff.

use std::io::Read;
use std::path::PathBuf;

use flate2::read::GzDecoder;
use prost::Message;

use super::pprof::Profile;
use super::{render, RenderOptions, Report};
use crate::aggregate::test_support::{prefork_report, server_report};
use crate::cli::Format;
use crate::diagnose::diagnose;

/// `tests/data/` of the workspace.
fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

/// Compares `actual` with `tests/data/<name>`, or writes it there when
/// `MEMTRACE_BLESS` is set.
fn check_golden(name: &str, actual: &[u8]) {
    let path = data_dir().join(name);
    if std::env::var_os("MEMTRACE_BLESS").is_some() {
        std::fs::create_dir_all(data_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
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

fn rendered(report: &Report, format: Format, options: &RenderOptions) -> Vec<u8> {
    let mut out = Vec::new();
    render(report, format, options, &mut out).unwrap();
    out
}

/// `report` with the diagnosis `memtrace` gives it, as the app renders it.
fn diagnosed(mut report: Report) -> Report {
    report.diagnosis = diagnose(&report);
    report
}

/// [`server_report`], diagnosed: its growing worker is weak retention (two
/// RSS readings, no idle stretch).
fn diagnosed_server_report() -> Report {
    diagnosed(server_report())
}

/// [`prefork_report`], diagnosed: it has no RSS readings, so weak no
/// growth.
fn diagnosed_prefork_report() -> Report {
    diagnosed(prefork_report())
}

#[test]
fn folded() {
    let out = rendered(
        &diagnosed_server_report(),
        Format::Folded,
        &RenderOptions::default(),
    );
    check_golden("server.folded", &out);
}

#[test]
fn flamegraph() {
    let report = diagnosed_server_report();
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
        &rendered(&diagnosed_prefork_report(), Format::Flamegraph, &inverted),
    );
}

#[test]
fn speedscope() {
    let out = rendered(
        &diagnosed_prefork_report(),
        Format::Speedscope,
        &RenderOptions::default(),
    );
    check_golden("prefork.speedscope.json", &out);
}

#[test]
fn html() {
    let out = rendered(
        &diagnosed_server_report(),
        Format::Html,
        &RenderOptions::default(),
    );
    check_golden("server.html", &out);
}

#[test]
fn table() {
    let options = RenderOptions::default();
    check_golden(
        "server.txt",
        &rendered(&diagnosed_server_report(), Format::Table, &options),
    );
    check_golden(
        "prefork.txt",
        &rendered(&diagnosed_prefork_report(), Format::Table, &options),
    );
}

#[test]
fn json() {
    let out = rendered(
        &diagnosed_server_report(),
        Format::Json,
        &RenderOptions::default(),
    );
    check_golden("server.json", &out);
}

#[test]
fn pprof() {
    let gzipped = rendered(
        &diagnosed_server_report(),
        Format::Pprof,
        &RenderOptions::default(),
    );
    let mut encoded = Vec::new();
    GzDecoder::new(gzipped.as_slice())
        .read_to_end(&mut encoded)
        .unwrap();
    let profile = Profile::decode(encoded.as_slice()).unwrap();
    check_golden("server.pprof.txt", format!("{profile:#?}\n").as_bytes());
}
