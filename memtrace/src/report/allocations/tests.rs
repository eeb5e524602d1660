//! Unit tests of allocator mode's files: folded stacks, pprof, speedscope
//! and the flame graph, drawn from synthetic reports (no kernel).

use super::*;
use crate::allocations::tests::{block, stack, w, MEAN, MIB};
use crate::allocations::{AllocationTracker, AllocationsReport, KernelAllocStats};

#[test]
fn folded_stacks_carry_the_chosen_weight() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(7, 0, 0);
    tracker.alloc(7, block(0, 0x1, 8 * MIB, false), stack("kept;odd"));
    tracker.alloc(7, block(0, 0x2, 4 * MIB, false), stack("freed"));
    tracker.free(7, 0, 0x2);
    let report = tracker.report(KernelAllocStats::default());
    let folded = |weight| {
        let mut out = Vec::new();
        render_folded(&report, weight, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    let kept = format!(
        "tgid 7;<module> (app.py:1);kept,odd (app.py:9) {}",
        w(8 * MIB).round()
    );
    assert_eq!(folded(AllocWeight::Leaked), format!("{kept}\n"));
    let allocated = folded(AllocWeight::Allocated);
    assert!(allocated.contains(&kept), "{allocated}");
    assert!(
        allocated.contains(&format!("freed (app.py:9) {}", w(4 * MIB).round())),
        "{allocated}"
    );
    assert_eq!(folded(AllocWeight::Peak), allocated);
}

/// Two processes with kept, freed and peak bytes on three paths.
fn two_process_report() -> AllocationsReport {
    let mut tracker = AllocationTracker::new(MEAN);
    for tgid in [1, 2] {
        tracker.process_started(tgid, u64::from(tgid), 0);
        tracker.hooked(tgid, vec!["libc.so.6".into()], 0, true);
    }
    tracker.alloc(1, block(0, 0x1, 8 * MIB, false), stack("kept"));
    tracker.alloc(1, block(0, 0x2, 4 * MIB, false), stack("freed"));
    tracker.free(1, 2_000_000_000, 0x2);
    tracker.alloc(2, block(0, 0x1, 2 * MIB, false), stack("kept"));
    tracker.report(KernelAllocStats::default())
}

const RUN: ProfileRun<'static> = ProfileRun {
    command: "python app.py",
    duration_ns: 3_000_000_000,
    inverted: false,
};

const WEIGHTS: [AllocWeight; 3] = [
    AllocWeight::Allocated,
    AllocWeight::Leaked,
    AllocWeight::Peak,
];

/// The report's total of `weight`, over every process.
fn total(report: &AllocationsReport, weight: AllocWeight) -> u64 {
    let totals: Vec<u64> = report
        .processes
        .iter()
        .map(|p| match weight {
            AllocWeight::Allocated => p.allocated_bytes,
            AllocWeight::Leaked => p.leaked_bytes,
            AllocWeight::Peak => p.peak_bytes,
        })
        .collect();
    totals.iter().sum()
}

#[test]
fn pprof_decodes_and_each_sample_type_sums_to_the_reports_total() {
    use prost::Message as _;
    use std::io::Read as _;
    let report = two_process_report();
    for weight in WEIGHTS {
        let mut gz = Vec::new();
        render_pprof(&report, weight, &RUN, &mut gz).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let profile = crate::report::pprof::Profile::decode(raw.as_slice()).unwrap();
        let string = |i: i64| profile.string_table[usize::try_from(i).unwrap()].clone();
        let types: Vec<String> = profile
            .sample_type
            .iter()
            .map(|t| string(t.r#type))
            .collect();
        assert_eq!(types, ["alloc_space", "inuse_space", "peak_space"]);
        for (index, measure) in WEIGHTS.into_iter().enumerate() {
            let sum: i64 = profile.sample.iter().map(|s| s.value[index]).sum();
            assert_eq!(sum, i64::try_from(total(&report, measure)).unwrap());
        }
        let default = string(profile.default_sample_type);
        assert_eq!(
            default,
            types[WEIGHTS.iter().position(|w| *w == weight).unwrap()]
        );
        assert_eq!(profile.period, i64::try_from(MEAN).unwrap());
    }
}

#[test]
fn speedscope_has_a_profile_per_process_summing_to_its_total() {
    let report = two_process_report();
    for weight in WEIGHTS {
        let mut out = Vec::new();
        render_speedscope(&report, weight, &RUN, &mut out).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let profiles = file["profiles"].as_array().unwrap();
        let mut sum = 0;
        for profile in profiles {
            let weights: u64 = profile["weights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_u64().unwrap())
                .sum();
            assert_eq!(profile["endValue"].as_u64(), Some(weights));
            sum += weights;
        }
        assert_eq!(sum, total(&report, weight), "{weight:?}");
        assert_eq!(profiles[0]["name"], "tgid 1");
    }
}

#[test]
fn the_flame_graph_draws_the_folded_lines_and_their_total() {
    let report = two_process_report();
    for weight in WEIGHTS {
        let mut out = Vec::new();
        render_flamegraph(&report, weight, &RUN, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.starts_with("<?xml"), "{svg}");
        assert!(svg.contains(weight.describe()), "no title in the svg");
        let digits = total(&report, weight).to_string();
        let mut grouped = String::new();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(digit);
        }
        assert!(
            svg.contains(&format!("all ({grouped} bytes, 100%)")),
            "{weight:?}"
        );
    }
    // No path with bytes of the weight: a small SVG that says so.
    let mut out = Vec::new();
    render_flamegraph(
        &AllocationTracker::new(MEAN).report(KernelAllocStats::default()),
        AllocWeight::Leaked,
        &RUN,
        &mut out,
    )
    .unwrap();
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("no sampled path has bytes leaked"));
}

#[test]
fn the_section_names_images_as_the_table_does_and_folds_unhooked_ones() {
    let processes = crate::report::fixtures::lifecycle_report().processes;
    let mut tracker = AllocationTracker::new(MEAN);
    // In the order the images began: 200, 201, 202 image 0, 201#2, 202
    // image 1 (the fixture's run). 201 and 202's `sleep` end unhooked.
    for (tgid, start_ns, hooked) in [
        (200, 1, true),
        (201, 2, false),
        (202, 3, true),
        (201, 4, true),
        (202, 3, false),
    ] {
        tracker.process_started(tgid, start_ns, 0);
        if hooked {
            tracker.hooked(tgid, vec!["libc.so.6".into()], 0, true);
            tracker.alloc(tgid, block(0, 0x1, 8 * MIB, false), stack("kept"));
        }
    }
    let report = tracker.report(KernelAllocStats::default());
    let mut out = Vec::new();
    render_text(&report, &processes, 10, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  tgid "))
        .map(|l| l.split(':').next().unwrap())
        .collect();
    named.sort_unstable();
    assert_eq!(named, ["200", "201#2", "202, image 0"], "{text}");
    assert!(
        text.contains("  2 process images ended before their allocator could be hooked"),
        "{text}"
    );
    assert!(!text.contains("process ended first"), "{text}");
}

#[test]
fn a_long_native_chain_still_shows_the_python_frame_that_called_it() {
    let chain = |natives: &[&str]| {
        let mut stack = vec![
            "<module> (app.py:1)".to_owned(),
            "lookup (app.py:34)".to_owned(),
        ];
        stack.extend(natives.iter().map(|n| (*n).to_owned()));
        stack
    };
    assert_eq!(
        text::shown_path(&chain(&[
            "execute",
            "sqlite3_step",
            "sqlite3VdbeExec",
            "pcache1Alloc"
        ])),
        "lookup (app.py:34) -> … -> sqlite3_step -> sqlite3VdbeExec -> pcache1Alloc"
    );
    assert_eq!(
        text::shown_path(&chain(&["sqlite3_step", "sqlite3VdbeExec", "pcache1Alloc"])),
        "lookup (app.py:34) -> sqlite3_step -> sqlite3VdbeExec -> pcache1Alloc"
    );
    assert_eq!(
        text::shown_path(&chain(&["list_append"])),
        "<module> (app.py:1) -> lookup (app.py:34) -> list_append"
    );
    let native_only: Vec<String> = ["main", "host_run", "host_fill", "host_fill_cache", "malloc"]
        .map(String::from)
        .into();
    assert_eq!(
        text::shown_path(&native_only),
        "host_run -> host_fill -> host_fill_cache -> malloc"
    );
}
