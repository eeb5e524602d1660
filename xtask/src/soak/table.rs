//! The soak's table: one row per sample (the agent's RSS, its CPU time per
//! window, the bytes it sent each sink per window), then the summary
//! (RSS after the first minutes against the 128 MiB goal, bytes per hour,
//! the service's median throughput with and without the agent and their
//! ratio).

use std::fmt::Write as _;

use super::{Block, Sample, SoakReport};

/// The goal for the agent's RSS after the first minutes, bytes.
pub const GOAL_RSS_BYTES: u64 = 128 << 20;

/// The sinks, in [`Sample::sent_bytes`] order.
const SINKS: [&str; 3] = ["prometheus", "otlp", "pyroscope"];

/// Where "after the first minutes" starts: 5 minutes, or a third of a
/// shorter soak.
fn settled_from_seconds(report: &SoakReport) -> f64 {
    let total = report.samples.last().map_or(0.0, |s| s.at_seconds);
    (total / 3.0).min(300.0)
}

/// The whole table, newline-terminated.
pub fn format_report(report: &SoakReport) -> String {
    let mut out = String::from(
        "\nsoak: memtrace agent --interval with --metrics (scraped by Prometheus), --otlp (the \
         collector), --pyroscope (stand-in /ingest)\n",
    );
    let _ = writeln!(
        out,
        "{:>6} {:>9} {:>8} {:>7} {:>10} {:>12} {:>12} {:>12} {:>11} {:>6}",
        "minute",
        "RSS MiB",
        "CPU s",
        "windows",
        "CPU/window",
        "prom B/win",
        "otlp B/win",
        "pyro B/win",
        "dropped rec",
        "load"
    );
    for pair in report.samples.windows(2) {
        out.push_str(&row(&pair[0], &pair[1]));
    }
    out.push_str(&summary(report));
    out
}

/// One row: `now` and what changed since `before`.
fn row(before: &Sample, now: &Sample) -> String {
    let windows = now.windows.saturating_sub(before.windows);
    let cpu = now.cpu_seconds - before.cpu_seconds;
    let per_window = |bytes: u64| -> String {
        if windows == 0 {
            "-".to_owned()
        } else {
            format!("{:.0}", bytes as f64 / windows as f64)
        }
    };
    let sent: Vec<String> = (0..SINKS.len())
        .map(|i| per_window(now.sent_bytes[i].saturating_sub(before.sent_bytes[i])))
        .collect();
    let cpu_per_window = if windows == 0 {
        "-".to_owned()
    } else {
        format!("{:.3}s", cpu / windows as f64)
    };
    format!(
        "{:>6.1} {:>9.1} {:>8.2} {:>7} {:>10} {:>12} {:>12} {:>12} {:>11} {:>6.2}\n",
        now.at_seconds / 60.0,
        mib(now.rss_bytes),
        cpu,
        windows,
        cpu_per_window,
        sent[0],
        sent[1],
        sent[2],
        now.records_dropped,
        now.load_average
    )
}

/// The summary lines under the rows.
fn summary(report: &SoakReport) -> String {
    let mut out = String::new();
    let (Some(first), Some(last)) = (report.samples.first(), report.samples.last()) else {
        return "no samples\n".to_owned();
    };
    let from = settled_from_seconds(report);
    let settled: Vec<&Sample> = report
        .samples
        .iter()
        .filter(|s| s.at_seconds >= from && s.rss_bytes > 0)
        .collect();
    let max = settled.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let min = settled.iter().map(|s| s.rss_bytes).min().unwrap_or(0);
    let change = match (settled.first(), settled.last()) {
        (Some(a), Some(b)) => mib(b.rss_bytes) - mib(a.rss_bytes),
        _ => 0.0,
    };
    let _ = writeln!(
        out,
        "agent RSS: {:.1} MiB at the start; from minute {:.1} to the end {:.1}-{:.1} MiB \
         (first to last {change:+.1} MiB); goal under {} MiB: {}",
        mib(report
            .samples
            .get(1)
            .map_or(first.rss_bytes, |s| s.rss_bytes)),
        from / 60.0,
        mib(min),
        mib(max),
        GOAL_RSS_BYTES >> 20,
        if max > 0 && max < GOAL_RSS_BYTES {
            "met"
        } else {
            "MISSED"
        }
    );
    let windows = last.windows.saturating_sub(first.windows);
    let cpu = last.cpu_seconds - first.cpu_seconds;
    let hours = (last.at_seconds - first.at_seconds) / 3600.0;
    let _ = writeln!(
        out,
        "agent CPU: {cpu:.1} s over {windows} windows of {} s: {:.3} s per window ({:.2}% of one \
         core); records dropped: {}",
        report.interval.as_secs(),
        cpu / windows.max(1) as f64,
        100.0 * cpu / (hours * 3600.0).max(1e-9),
        last.records_dropped
    );
    for (i, sink) in SINKS.iter().enumerate() {
        let bytes = last.sent_bytes[i].saturating_sub(first.sent_bytes[i]);
        let _ = writeln!(
            out,
            "sent to {sink:<10}: {bytes} bytes, {:.0} per window, {:.1} MB per hour",
            bytes as f64 / windows.max(1) as f64,
            bytes as f64 / hours.max(1e-9) / 1e6
        );
    }
    if let Some(read) = report
        .samples
        .iter()
        .rev()
        .find(|s| s.own_rss_metric_bytes > 0)
    {
        let _ = writeln!(
            out,
            "memtrace_resident_bytes on the agent's page at minute {:.1}: {:.1} MiB (its VmRSS \
             then: {:.1} MiB)",
            read.at_seconds / 60.0,
            mib(read.own_rss_metric_bytes),
            mib(read.rss_bytes)
        );
    }
    let _ = writeln!(
        out,
        "received: {} profile exports printed by the collector, {} pprof /ingest requests; \
         memtrace_resident_bytes on Prometheus at the end: {}",
        report.collector_exports,
        report.pprof_requests,
        report
            .prometheus_own_rss_bytes
            .map_or("none".to_owned(), |b| format!("{:.1} MiB", b / 1048576.0))
    );
    out.push_str(&throughput(&report.blocks));
    let _ = writeln!(out, "agent's last window line: {}", report.last_window_line);
    out
}

/// The throughput lines: each block, then the medians and their ratio.
fn throughput(blocks: &[Block]) -> String {
    let rates = |traced: bool| -> Vec<f64> {
        blocks
            .iter()
            .filter(|b| b.traced == traced)
            .map(|b| b.requests_per_second)
            .collect()
    };
    let (mut with, mut without) = (rates(true), rates(false));
    let listed: Vec<String> = blocks
        .iter()
        .map(|b| {
            format!(
                "{}{:.0}",
                if b.traced { "A" } else { "-" },
                b.requests_per_second
            )
        })
        .collect();
    let confirmed = blocks.iter().filter(|b| b.confirmed).count();
    let mut out = format!(
        "service throughput, requests/s per block (A: with the agent): {}\n",
        listed.join(" ")
    );
    let (Some(a), Some(b)) = (median(&mut with), median(&mut without)) else {
        return out;
    };
    let _ = writeln!(
        out,
        "service throughput: median {a:.1} requests/s with the agent ({} blocks), {b:.1} without \
         ({} blocks): ratio with/without {:.3}; blocks the agent's page agreed on: {confirmed}/{}",
        with.len(),
        without.len(),
        a / b,
        blocks.len()
    );
    out
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// Bytes in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}
