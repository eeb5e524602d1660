//! Unit tests of `cargo xtask bench --soak`: the table's arithmetic, the
//! metric reader, and a short soak against the real backends (root: it
//! loads the agent's eBPF programs).

use std::time::Duration;

use super::table::{format_report, median};
use super::*;

fn sample(minute: f64, rss_mib: u64, cpu_seconds: f64, windows: u64, sent: [u64; 3]) -> Sample {
    Sample {
        at_seconds: minute * 60.0,
        rss_bytes: rss_mib << 20,
        cpu_seconds,
        windows,
        sent_bytes: sent,
        load_average: 3.5,
        ..Sample::default()
    }
}

fn block(traced: bool, requests_per_second: f64) -> Block {
    Block {
        traced,
        requests_per_second,
        confirmed: true,
    }
}

#[test]
fn the_table_has_per_window_figures_per_row_and_the_medians_ratio() {
    let report = SoakReport {
        samples: vec![
            sample(0.0, 20, 0.0, 0, [0; 3]),
            sample(1.0, 40, 1.0, 4, [4000, 8000, 2000]),
            sample(2.0, 41, 2.6, 8, [8000, 16000, 4000]),
        ],
        blocks: vec![
            block(true, 90.0),
            block(false, 100.0),
            block(false, 110.0),
            block(true, 99.0),
        ],
        interval: Duration::from_secs(15),
        ..SoakReport::default()
    };
    let table = format_report(&report);
    // Minute 2: 1.6 s of CPU over 4 windows, 1000/2000/500 bytes a window.
    let minute_2 = table
        .lines()
        .find(|l| l.trim_start().starts_with("2.0"))
        .expect("row of minute 2");
    let cells: Vec<&str> = minute_2.split_whitespace().collect();
    assert_eq!(
        cells[..8],
        ["2.0", "41.0", "1.60", "4", "0.400s", "1000", "2000", "500"]
    );
    assert!(
        table.contains("median 94.5 requests/s with the agent (2 blocks), 105.0 without"),
        "{table}"
    );
    assert!(table.contains("ratio with/without 0.900"), "{table}");
    // 16000 otlp bytes in 2 minutes: 0.48 MB an hour, 2000 a window.
    assert!(
        table.contains("sent to otlp      : 16000 bytes, 2000 per window, 0.5 MB per hour"),
        "{table}"
    );
    assert!(
        table.contains("from minute 0.7 to the end 40.0-41.0 MiB"),
        "{table}"
    );
    assert!(table.contains("goal under 128 MiB: met"), "{table}");
}

#[test]
fn an_rss_over_the_goal_is_missed() {
    let report = SoakReport {
        samples: vec![
            sample(0.0, 20, 0.0, 0, [0; 3]),
            sample(9.0, 146, 9.0, 36, [1; 3]),
        ],
        ..SoakReport::default()
    };
    assert!(format_report(&report).contains("goal under 128 MiB: MISSED"));
}

#[test]
fn metric_values_are_read_from_unlabelled_samples_only() {
    let page = "# TYPE memtrace_resident_bytes gauge\nmemtrace_resident_bytes 41943040\n\
                memtrace_windows_emitted_total 7\nmemtrace_windows_emitted_total_x 9\n";
    assert_eq!(
        metric_value(page, "memtrace_resident_bytes"),
        Some(41943040.0)
    );
    assert_eq!(
        metric_value(page, "memtrace_windows_emitted_total"),
        Some(7.0)
    );
    assert_eq!(metric_value(page, "memtrace_records_read_total"), None);
    assert_eq!(median(&mut []), None);
    assert_eq!(median(&mut [3.0, 1.0]), Some(2.0));
}

/// The memtrace binary `cargo xtask test` built: release (built for the
/// tarball first), else debug.
fn memtrace_binary() -> PathBuf {
    ["target/release/memtrace", "target/debug/memtrace"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("no memtrace binary under target/ (cargo xtask test builds one)")
}

/// The soak in short: 40 s, blocks of 5 s, a window every 2 s, a row
/// every 10 s, 4 workers, against the real Prometheus and collector.
#[test]
#[ignore = "root: loads memtrace agent's eBPF programs; run by cargo xtask test as root"]
fn a_short_soak_measures_every_column() {
    std::env::set_current_dir(crate::workspace_root()).unwrap();
    let args = SoakArgs {
        duration: Duration::from_secs(40),
        block: Duration::from_secs(5),
        interval: Duration::from_secs(2),
        sample_every: Duration::from_secs(10),
        workers: 4,
        memtrace_bin: memtrace_binary(),
        python: crate::python_for_examples().unwrap(),
        scratch: PathBuf::from("target/bench/soak-test"),
    };
    let report = run(&args).expect("the short soak");
    let table = format_report(&report);
    eprintln!("{table}");
    assert!(report.samples.len() >= 4, "{table}");
    let last = report.samples.last().unwrap();
    assert!(last.windows >= 10, "a window every 2 s: {table}");
    assert!(
        last.sent_bytes.iter().all(|&b| b > 0),
        "every sink got bytes: {table}"
    );
    assert!(
        report.collector_exports > 0 && report.pprof_requests > 0,
        "{table}"
    );
    assert!(report.samples.iter().all(|s| s.rss_bytes > 0), "{table}");
    let rss = report.samples[report.samples.len() - 2].own_rss_metric_bytes as f64;
    let proc_rss = report.samples[report.samples.len() - 2].rss_bytes as f64;
    assert!(
        (rss - proc_rss).abs() <= 0.5 * proc_rss,
        "memtrace_resident_bytes {rss} vs VmRSS {proc_rss}"
    );
    assert!(
        report.prometheus_own_rss_bytes.is_some_and(|b| b > 0.0),
        "{table}"
    );
    assert!(report.blocks.iter().any(|b| b.traced) && report.blocks.iter().any(|b| !b.traced));
    assert!(
        report
            .blocks
            .iter()
            .all(|b| b.confirmed && b.requests_per_second > 0.0),
        "{table}"
    );
    assert!(table.contains("ratio with/without"), "{table}");
}

#[test]
fn the_traced_copy_is_matched_by_its_escaped_path() {
    assert_eq!(
        traced_match(Path::new("/work/t.b/soak-test/traced")),
        "/work/t\\.b/soak-test/traced/server\\.py"
    );
}
