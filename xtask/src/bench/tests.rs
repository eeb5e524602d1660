//! Unit tests of `cargo xtask bench`: run order, configuration choice, the
//! table, and the report readers.

use super::*;

#[test]
fn median_of_odd_and_even_lengths() {
    assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
}

#[test]
fn phase_line_takes_the_last_json_object_with_phase_seconds() {
    let stdout = "memtrace: tracing\n{\"event\": \"timed\", \"phase_seconds\": 0.5}\nnot json\n{\"event\": \"exit\"}\n";
    let line = phase_line(stdout).expect("phase line");
    assert_eq!(line["phase_seconds"].as_f64(), Some(0.5));
    assert!(phase_line("{\"event\": \"exit\"}").is_none());
}

#[test]
fn the_top_path_sums_the_native_parts_of_one_python_stack() {
    let report = r#"{
        "stacks": [
            [{"kind": "python", "function": "grow"}, {"kind": "native", "symbol": "a"}],
            [{"kind": "python", "function": "grow"}, {"kind": "native", "symbol": "b"}],
            [{"kind": "python", "function": "other"}]
        ],
        "paths": [
            {"process": 1, "stack": 0, "bytes": {"growth_bytes": 600}},
            {"process": 1, "stack": 2, "bytes": {"growth_bytes": 700}},
            {"process": 1, "stack": 1, "bytes": {"growth_bytes": 500.4}},
            {"process": 2, "stack": 1, "bytes": {"growth_bytes": 400}}
        ]
    }"#;
    assert_eq!(top_python_path_bytes(report), Some(1100));
    assert_eq!(top_python_path_bytes(r#"{"paths": []}"#), None);
}

#[test]
fn relative_error_is_signed() {
    assert!((relative_error(1_250, 1_000) - 0.25).abs() < 1e-12);
    assert!((relative_error(750, 1_000) + 0.25).abs() < 1e-12);
    assert_eq!(relative_error(5, 0), 0.0);
}

#[test]
fn run_order_rotates_so_each_configuration_goes_first_in_turn() {
    let orders: Vec<Vec<usize>> = (0..4).map(|run| run_order(4, run).collect()).collect();
    assert_eq!(
        orders,
        [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]]
    );
    // Two configurations alternate as the bench always did.
    assert_eq!(run_order(2, 0).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(run_order(2, 1).collect::<Vec<_>>(), [1, 0]);
}

#[test]
fn peers_flag_selects_workloads_and_configurations() {
    assert_eq!(configs_for(Peers::Never, false), Some(DEFAULT_CONFIGS));
    assert_eq!(configs_for(Peers::Never, true), Some(DEFAULT_CONFIGS));
    assert_eq!(configs_for(Peers::Only, false), None);
    assert_eq!(configs_for(Peers::Only, true), Some(PEER_CONFIGS));
    let default_names: Vec<&str> = WORKLOADS
        .iter()
        .filter(|w| configs_for(w.peers, false).is_some())
        .map(|w| w.name)
        .collect();
    assert_eq!(default_names, ["alloc loop (5M dicts)", "growth (1 GiB)"]);
}

#[test]
fn configurations_start_with_the_untraced_baseline() {
    for configs in [DEFAULT_CONFIGS, PEER_CONFIGS] {
        assert_eq!(configs[0], Config::Untraced);
    }
    let labels: Vec<&str> = PEER_CONFIGS.iter().map(|c| c.label()).collect();
    assert_eq!(
        labels,
        [
            "untraced",
            "memtrace",
            "sampler",
            "uprobes",
            "tracemalloc",
            "memray"
        ]
    );
}

#[test]
fn memray_file_sits_beside_the_scratch_folder() {
    assert_eq!(
        memray_file(Path::new("target/bench/json_loads-2")),
        Path::new("target/bench/json_loads-2.memray.bin")
    );
}

#[test]
fn cells_show_seconds_and_ratio_or_a_dash() {
    assert_eq!(cell(Config::Untraced, Some(2.0), Some(2.0)), "2.000s");
    assert_eq!(cell(Config::Memray, Some(5.0), Some(2.0)), "5.000s 2.50x");
    assert_eq!(cell(Config::Tracemalloc, None, Some(2.0)), "-");
}

#[test]
fn table_has_a_column_per_configuration() {
    let rows = [
        Row {
            name: "alloc loop (5M dicts)",
            goal_ratio: Some(1.05),
            medians: vec![
                (Config::Untraced, 2.0),
                (Config::Memtrace, 2.02),
                (Config::Sampler, 3.0),
                (Config::Allocations, 52.0),
                (Config::Tracemalloc, 20.0),
                (Config::Memray, 8.0),
            ],
            growth_error: None,
            alloc_calls: Some(10_000_000.0),
        },
        Row {
            name: "growth (1 GiB)",
            goal_ratio: Some(1.15),
            medians: vec![(Config::Untraced, 1.0), (Config::Memtrace, 1.2)],
            growth_error: Some(-0.02),
            alloc_calls: None,
        },
    ];
    let table = format_table(PEER_CONFIGS, &rows);
    let lines: Vec<&str> = table.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("workload"))
        .expect("header");
    assert_eq!(
        lines[header],
        "workload                        untraced        memtrace         sampler         uprobes     tracemalloc          memray  memtrace goal         top path vs true growth"
    );
    assert_eq!(
        lines[header + 1],
        "alloc loop (5M dicts)             2.000s    2.020s 1.01x    3.000s 1.50x  52.000s 26.00x  20.000s 10.00x    8.000s 4.00x  <= 1.05x: met         -"
    );
    assert_eq!(
        lines[header + 2],
        "growth (1 GiB)                    1.000s    1.200s 1.20x               -               -               -               -  <= 1.15x: MISSED      -2.0% (goal within 25%: met)"
    );
    // (52 s - 2 s) / 10M calls.
    assert_eq!(
        lines[header + 3],
        "allocations on alloc loop (5M dicts): 5000 ns added per allocator call (10000000 calls per run)"
    );
    assert!(table.contains("tracemalloc  python -X tracemalloc SCRIPT"));
}
