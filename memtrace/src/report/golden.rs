//! Golden-file tests of the report step: every text format rendered from
//! the fixed fixtures of `aggregate::test_support` (plus a diagnosis) and
//! compared byte for byte with `tests/data/`. Run with `MEMTRACE_BLESS=1` to
//! rewrite the files after an intended change, then review their diff.

use std::path::PathBuf;

use super::{render, RenderOptions, Report};
use crate::aggregate::test_support::{prefork_report, server_report};
use crate::cli::Format;
use crate::diagnose::{Finding, Pattern, Scope, Strength};

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
        let actual_path = path.with_extension("actual");
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

/// [`server_report`] with the diagnosis the growing worker deserves, one
/// strong and one weak finding.
fn diagnosed_server_report() -> Report {
    let mut report = server_report();
    let leak = report.paths[0].stack;
    let parse = report.paths[1].stack;
    report.diagnosis = vec![
        Finding {
            pattern: Pattern::OneProcessGrows,
            scope: Scope::Process { tgid: 101 },
            strength: Strength::Strong,
            summary: "worker 101 grew by 48.0 MiB while its 1 sibling stayed flat".to_owned(),
            evidence: vec![
                "tgid 101: RSS 20.0 MiB → 68.0 MiB".to_owned(),
                "tgid 100: RSS 20.0 MiB → 20.0 MiB".to_owned(),
            ],
            paths: vec![leak, parse],
            next_step: "bound the cache that append (app/cache.py:42) fills".to_owned(),
        },
        Finding {
            pattern: Pattern::Retention,
            scope: Scope::Process { tgid: 101 },
            strength: Strength::Weak,
            summary: "memory stays up <after> activity drops & \"idle\"".to_owned(),
            evidence: vec!["only 2 RSS readings".to_owned()],
            paths: vec![leak],
            next_step: "record longer to see whether it keeps rising".to_owned(),
        },
    ];
    report
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
        &rendered(&prefork_report(), Format::Flamegraph, &inverted),
    );
}

#[test]
fn speedscope() {
    let out = rendered(
        &prefork_report(),
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
        &rendered(&prefork_report(), Format::Table, &options),
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
