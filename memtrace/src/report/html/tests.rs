//! Tests of the HTML renderer: escaping, the order of the sections (the
//! first screen before the process table), the verdict in the terminal's
//! words, the process tree, the RSS charts (lines, marks whose labels show
//! only on hover, shading), the top paths with their timelines and the
//! copy-on-write section, on the report fixtures.

use super::*;
use crate::aggregate::test_support::{native, prefork_report, py};
use crate::aggregate::{ExitStatus, Frame, Weight};
use crate::report::fixtures::server_diagnosed;
use crate::report::fixtures::{lifecycle_diagnosed, lifecycle_report, S};
use crate::report::verdict;

fn page_with(report: &Diagnosed, options: &RenderOptions) -> String {
    let mut out = Vec::new();
    render(report, options, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn page(report: &Diagnosed) -> String {
    page_with(report, &RenderOptions::default())
}

/// The `<figure>` of the chart of image `id`.
fn figure(html: &str, id: u32) -> &str {
    let start = html
        .find(&format!("id=\"rss-p{id}\""))
        .unwrap_or_else(|| panic!("no chart of p{id}"));
    let rest = &html[start..];
    &rest[..rest.find("</figure>").unwrap()]
}

/// The `<tr>` of the process table whose first cell is `name`.
fn tree_row<'a>(html: &'a str, name: &str) -> &'a str {
    let start = html
        .find(&format!("<tr><td>{name}</td>"))
        .unwrap_or_else(|| panic!("no row {name}"));
    let rest = &html[start..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// The part of `html` from the element with id `id` to the next `</section>`.
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no {id}"));
    let rest = &html[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

#[test]
fn the_first_screen_comes_before_the_process_table() {
    let html = page(&server_diagnosed());
    let at = |needle: &str| html.find(needle).unwrap_or_else(|| panic!("no {needle}"));
    assert!(at("id=\"verdict\"") < at("id=\"rss-chart\""));
    assert!(at("id=\"rss-chart\"") < at("id=\"top-paths\""));
    assert!(at("id=\"top-paths\"") < at("id=\"processes\""));
    assert!(at("id=\"processes\"") < at("id=\"cow\""));
    assert!(at("id=\"cow\"") < at("id=\"flamegraph\""));
    assert!(at("id=\"flamegraph\"") < at("id=\"rss\""));
    assert!(at("id=\"rss\"") < at("id=\"findings\""));
    assert!(at("id=\"findings\"") < at("id=\"warnings\""));
    // The per-image charts and the findings are collapsed.
    assert!(section(&html, "rss").contains("<details>\n<summary>"));
    assert!(section(&html, "findings").contains("<details>\n<summary>"));
    assert!(!html.contains("<details open"), "expanded by default");
    assert!(!html.contains("<?xml"), "prologue inside the page");
    assert!(!html.contains("src=\"http"), "network reference");
    assert!(!html.contains("href=\"http"), "network reference");
    assert!(!html.contains("url(http"), "network reference");
}

#[test]
fn the_verdict_uses_the_terminal_words() {
    for report in [server_diagnosed(), lifecycle_diagnosed()] {
        let html = page(&report);
        let shown = section(&html, "verdict");
        let parts = verdict::verdict(&report);
        assert!(!parts.causes.is_empty());
        assert!(shown.contains(&format!("<h2>{}</h2>", escape(&parts.heading))));
        for cause in &parts.causes {
            let head = format!(
                "<span class=\"pattern\">{}</span> in {}</p>",
                escape(&cause.patterns),
                escape(&cause.who)
            );
            assert!(shown.contains(&head), "{head} not in {shown}");
            let answers = cause
                .what
                .iter()
                .chain(&cause.how_much)
                .chain(&cause.places);
            for answer in answers.chain(std::iter::once(&cause.next)) {
                assert!(shown.contains(&escape(answer)), "{answer} not in {shown}");
                // The same words as the terminal's lines.
                assert!(
                    verdict::lines(&report)
                        .iter()
                        .any(|l| l.ends_with(answer.as_str())),
                    "{answer}"
                );
            }
        }
    }
}

#[test]
fn the_findings_are_all_listed_below() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let findings = section(&html, "findings");
    assert!(findings.contains(&format!("({})</h2>", report.diagnosis.len())));
    assert_eq!(
        findings.matches("<div class=\"finding ").count(),
        report.diagnosis.len()
    );
    for finding in &report.diagnosis {
        assert!(findings.contains(&escape(&finding.summary)), "{findings}");
    }
}

#[test]
fn processes_are_listed_in_tree_order() {
    let report = prefork_report();
    let order: Vec<(usize, u32)> = tree_order(&report)
        .iter()
        .map(|(d, p)| (*d, p.tgid))
        .collect();
    assert_eq!(order, [(0, 100), (1, 101), (1, 102), (1, 103)]);
}

#[test]
fn an_image_after_an_exec_hangs_under_the_one_it_replaced() {
    let report = lifecycle_report();
    let order: Vec<(usize, String)> = tree_order(&report)
        .iter()
        .map(|(d, p)| (*d, p.name()))
        .collect();
    let expected = [
        (0, "tgid 200"),
        (1, "tgid 201"),
        (1, "tgid 202, image 0"),
        (2, "tgid 202, image 1"),
        (1, "tgid 201#2"),
    ]
    .map(|(d, n)| (d, n.to_owned()));
    assert_eq!(order, expected);
}

#[test]
fn rows_give_each_image_its_numbers_and_end() {
    let html = page(&lifecycle_diagnosed());
    assert_eq!(
        tree_row(&html, "tgid 201"),
        "<tr><td>tgid 201</td><td>worker</td><td>30.0 MiB</td><td>70.0 MiB</td>\
         <td>80.0 MiB</td><td>+40.0 MiB</td><td>50.0 MiB</td><td>8.0 MiB</td>\
         <td>60.0 MiB</td><td>3.12.1</td><td>1.0 s</td><td>exit 0 at 4.0 s</td>\
         <td class=\"cmd\">&nbsp;&nbsp;&nbsp;└ python3 -m app</td>"
    );
    let second = tree_row(&html, "tgid 201#2");
    assert!(second.contains("<td>+30.0 MiB</td>"), "{second}");
    assert!(second.contains("<td>SIGKILL at 7.0 s</td>"), "{second}");
    let etl = tree_row(&html, "tgid 202, image 0");
    assert!(etl.contains("<td>exec&#39;d at 6.0 s</td>"), "{etl}");
    let sleep = tree_row(&html, "tgid 202, image 1");
    assert!(
        sleep.contains("&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;└ sleep 60"),
        "{sleep}"
    );
    assert!(sleep.contains("<td>not Python</td>"), "{sleep}");
    assert!(sleep.contains("<td>alive</td>"), "{sleep}");
    let at = |needle: &str| html.find(needle).unwrap_or_else(|| panic!("no {needle}"));
    assert!(at("<tr><td>tgid 202, image 0") < at("<tr><td>tgid 202, image 1"));
    assert!(at("<tr><td>tgid 202, image 1") < at("<tr><td>tgid 201#2"));
}

#[test]
fn charts_mark_forks_execs_and_exits_and_shade_after_the_end() {
    let html = page(&lifecycle_diagnosed());
    let master = figure(&html, 0);
    assert!(master.contains("forked tgid 201 at 1.0 s"), "{master}");
    assert!(master.contains("forked tgid 201#2 at 5.0 s"), "{master}");
    assert!(
        master.contains("forked tgid 202, image 0 at 2.0 s"),
        "{master}"
    );
    // The image after the exec is not a fork.
    assert!(!master.contains("image 1"), "{master}");
    assert!(!master.contains("exit-mark"), "{master}");
    assert!(!master.contains("after-end"), "{master}");
    assert!(master.contains("class=\"uss\""), "{master}");
    let first = figure(&html, 1);
    assert!(first.contains("began to exit at 4.0 s (exit 0)"), "{first}");
    assert!(first.contains("class=\"after-end\""), "{first}");
    let killed = figure(&html, 3);
    assert!(
        killed.contains("began to exit at 7.0 s (SIGKILL)"),
        "{killed}"
    );
    let etl = figure(&html, 2);
    assert!(etl.contains("class=\"mark exec-mark\""), "{etl}");
    assert!(
        etl.contains("exec&#39;d at 6.0 s: the next image starts"),
        "{etl}"
    );
    assert!(!etl.contains("exit-mark"), "{etl}");
    let sleep = figure(&html, 4);
    assert!(!sleep.contains("class=\"uss\""), "{sleep}");
    assert!(sleep.contains("<figcaption>tgid 202, image 1 <code>sleep 60</code>: alive"));
}

#[test]
fn the_line_stops_where_the_image_ends() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let first = figure(&html, 1);
    let points = first
        .split("class=\"rss-line\" points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let last_x: f64 = points
        .rsplit(' ')
        .next()
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // At the exit mark, 4 s of an 8 s axis: half way along the plot.
    let exit = &first[first.find("class=\"mark exit-mark\"").unwrap()..];
    let tick_x: f64 = exit
        .split("x1=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((last_x - tick_x).abs() < 0.1, "{points} vs {tick_x}");
    let plot = chart::Plot::new(620.0, 180.0, 8 * S, 1);
    assert!((plot.x(4 * S) - tick_x).abs() < 0.1, "{tick_x}");
}

/// The `<tr>` of the top-paths table at `rank` (from 1).
fn path_row(html: &str, rank: usize) -> &str {
    let paths = section(html, "top-paths");
    let start = paths
        .find(&format!("<tr><td>{rank}</td>"))
        .unwrap_or_else(|| panic!("no row {rank} in {paths}"));
    let rest = &paths[start..];
    &rest[..rest.find("</tr>").unwrap()]
}

#[test]
fn top_paths_are_named_by_the_users_frame_with_three_measures() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let first = path_row(&html, 1);
    // load (etl.py:12) holds 60 MiB in tgid 202's first image.
    assert!(
        first.contains("<summary><code>load (etl.py:12)</code></summary>"),
        "{first}"
    );
    assert!(
        first.contains(
            "<td>60.0 MiB</td><td>60.0 MiB</td><td>60.0 MiB</td><td>40.0%</td>\
             <td><span title=\"tgid 202, image 0\">1 worker</span></td>"
        ),
        "{first}"
    );
    // The stack, innermost first, behind the summary.
    assert!(first.contains("<ul class=\"frames\"><li>"), "{first}");
    let cache = path_row(&html, 3);
    assert!(
        cache.contains("<code>append (cache.py:42)</code>"),
        "{cache}"
    );
    assert!(
        cache.contains(
            "<td>40.0 MiB</td><td>30.0 MiB</td><td>40.0 MiB</td><td>26.7%</td>\
             <td><span title=\"tgid 201, tgid 201#2\">2 workers</span></td>"
        ),
        "{cache}"
    );
    let grown = page_with(
        &report,
        &RenderOptions {
            weight: Weight::Grown,
            ..RenderOptions::default()
        },
    );
    let first = path_row(&grown, 1);
    assert!(
        first.contains("<code>handle_job (jobs.py:20)</code>"),
        "{first}"
    );
    assert!(
        first.contains("<td>120.0 MiB</td><td>54.5%</td>"),
        "{first}"
    );
    assert!(section(&grown, "top-paths").contains("by bytes grown"));
}

#[test]
fn stacks_with_one_place_are_one_top_path() {
    let mut report = lifecycle_diagnosed();
    // `load` becomes another stack through `append`: a different native
    // leaf under the same line.
    let load = report.top_stacks(Weight::Peak, 1)[0].stack;
    let mut frames = crate::report::fixtures::cache_stack();
    *frames.last_mut().unwrap() = native("memcpy");
    report.report.stacks[load.0 as usize] = frames;
    let rows = paths::top_places(&report, Weight::Peak, 10);
    let names: Vec<&str> = rows.iter().map(|r| r.place.as_str()).collect();
    assert_eq!(names, ["append (cache.py:42)", "handle_job (jobs.py:20)"]);
    let append = &rows[0];
    // 60 MiB in tgid 202's first image and 40 MiB in tgid 201 and 201#2.
    assert_eq!(append.peak_held_bytes, 100 * 1024 * 1024);
    assert_eq!(append.stacks.len(), 2);
    assert_eq!(append.processes.len(), 3);
    let html = page(&report);
    let row = path_row(&html, 1);
    assert_eq!(row.matches("<ul class=\"frames\">").count(), 2, "{row}");
    assert!(row.contains("<td>100.0 MiB</td>"), "{row}");
    assert!(row.contains(">3 workers</span>"), "{row}");
    // Its timeline sums both stacks' growth.
    let both = paths::growth_per_bucket(&report, &append.stacks);
    let one = paths::growth_per_bucket(&report, &append.stacks[..1]);
    assert!(both.values().sum::<u64>() > one.values().sum::<u64>());
    assert!(row.contains(&paths::sparkline(
        &report,
        &append.stacks,
        chart::chart_end_ns(&report)
    )));
}

#[test]
fn a_path_in_a_library_is_named_by_the_users_caller() {
    let frames = vec![
        py("<module>", "app/worker.py", 1),
        py("render_report", "app/views.py", 84),
        py("dumps", "/usr/lib/python3.12/json/__init__.py", 231),
        native("malloc"),
    ];
    let (place, via) = paths::place_name(&frames);
    assert_eq!(place, "render_report (views.py:84)");
    assert_eq!(via.as_deref(), Some("dumps (__init__.py:231)"));
    assert_eq!(
        paths::place_name(&frames[..2]),
        ("render_report (views.py:84)".to_owned(), None)
    );
    let library = [Frame::Mapping {
        mapping: crate::aggregate::MappingKind::File,
        name: "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0".to_owned(),
    }];
    assert_eq!(
        paths::place_name(&library),
        ("[file libsqlite3.so.0]".to_owned(), None)
    );
}

#[test]
fn the_top_five_paths_show_when_they_grew() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let end_ns = chart::chart_end_ns(&report);
    // handle_job grew 40 MiB in each of three one-second buckets of tgid 201.
    let stack = report.top_stacks(Weight::Grown, 1)[0].stack;
    let buckets = paths::growth_per_bucket(&report, &[stack]);
    assert_eq!(buckets.len(), 3, "{buckets:?}");
    assert!(
        buckets.values().all(|&b| b == 40 * 1024 * 1024),
        "{buckets:?}"
    );
    let spark = paths::sparkline(&report, &[stack], end_ns);
    assert_eq!(spark.matches("<rect ").count(), 3, "{spark}");
    for t_ns in buckets.keys() {
        let tooltip = format!("<title>{}: +40.0 MiB grown</title>", seconds(*t_ns));
        assert!(spark.contains(&tooltip), "{spark}");
    }
    // Equal growth: equal, full-height bars.
    assert_eq!(spark.matches("height=\"21.0\"").count(), 3, "{spark}");
    let row = path_row(&html, 2);
    assert!(row.contains(&spark), "{row}");
    let table = section(&html, "top-paths");
    let rows = table.matches("<tr><td>").count();
    assert_eq!(
        table.matches("<svg class=\"spark\"").count(),
        rows.min(paths::TIMELINE_PATHS)
    );
}

#[test]
fn only_the_first_five_paths_get_a_timeline() {
    let report = server_diagnosed();
    let options = RenderOptions {
        top: 7,
        ..RenderOptions::default()
    };
    let html = page_with(&report, &options);
    let table = section(&html, "top-paths");
    let rows = table.matches("<tr><td>").count();
    let sparks =
        table.matches("<svg class=\"spark\"").count() + table.matches("no growth sampled").count();
    assert_eq!(sparks, rows.min(paths::TIMELINE_PATHS), "{table}");
}

#[test]
fn the_cow_section_lists_each_process_paths_with_bytes() {
    let html = page(&lifecycle_diagnosed());
    let cow = section(&html, "cow");
    // tgid 201 (8 MiB exact) before tgid 201#2 (4 MiB exact).
    let first = cow
        .find("worker tgid 201 <code>")
        .unwrap_or_else(|| panic!("{cow}"));
    let second = cow
        .find("worker tgid 201#2 <code>")
        .unwrap_or_else(|| panic!("{cow}"));
    assert!(first < second, "{cow}");
    assert!(cow[first..]
        .starts_with("worker tgid 201 <code>python3 -m app</code></th><th>8.0 MiB</th>"));
    // tgid 201#2's sampled copy-on-write: 4 MiB in append.
    assert!(
        cow[second..].contains("<code>append (cache.py:42)</code></summary>"),
        "{cow}"
    );
    assert!(
        cow[second..].contains("<td>4.0 MiB</td><td>100%</td>"),
        "{cow}"
    );
    let mut report = server_diagnosed();
    for path in &mut report.report.paths {
        path.bytes.cow_bytes = 0;
    }
    for counters in report
        .report
        .processes
        .iter_mut()
        .filter_map(|p| p.counters.as_mut())
    {
        counters.cow_fault_bytes = 0;
    }
    let none = page(&report);
    assert!(
        section(&none, "cow").contains("No process un-shared copy-on-write pages."),
        "{none}"
    );
}

#[test]
fn the_overview_draws_each_growing_process_with_a_legend() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let overview = &html[html.find("id=\"rss-chart\"").unwrap()..];
    let overview = &overview[..overview.find("</figure>").unwrap()];
    let (growing, left_out) = chart::growing(&report);
    assert_eq!(left_out, 0);
    // 201, 202 image 0, 201#2 and sleep grew; the master stayed flat.
    assert_eq!(growing.len(), 4);
    assert_eq!(overview.matches("class=\"rss-line\"").count(), 4);
    assert!(!overview.contains("tgid 200"), "{overview}");
    assert!(
        overview.contains("</span>worker tgid 201 <code>python3 -m app</code> +40.0 MiB</li>"),
        "{overview}"
    );
    // Every fork of the run and each drawn process's end.
    assert_eq!(overview.matches("class=\"mark fork-mark\"").count(), 3);
    assert!(
        overview.contains("tgid 201 began to exit at 4.0 s (exit 0)"),
        "{overview}"
    );
    assert!(
        overview.contains("tgid 202, image 0 exec&#39;d at 6.0 s"),
        "{overview}"
    );
}

#[test]
fn mark_labels_show_only_on_hover() {
    let html = page(&lifecycle_diagnosed());
    assert!(STYLE.contains("svg.chart .mark-label { visibility: hidden;"));
    assert!(STYLE.contains("svg.chart .mark:hover .mark-label { visibility: visible; }"));
    let marks: Vec<&str> = html.split("<g class=\"mark ").skip(1).collect();
    assert!(marks.len() >= 8, "{}", marks.len());
    for mark in marks {
        let mark = &mark[..mark.find("</g>").unwrap()];
        // One label, the hidden one, and a tooltip saying the same.
        assert_eq!(mark.matches("<text").count(), 1, "{mark}");
        assert!(mark.contains("<text class=\"mark-label\""), "{mark}");
        let tooltip = &mark[mark.find("<title>").unwrap() + 7..mark.find("</title>").unwrap()];
        assert!(mark.contains(&format!(">{tooltip}</text>")), "{mark}");
    }
}

#[test]
fn no_growth_is_said_on_the_first_screen() {
    let mut report = server_diagnosed();
    for p in &mut report.report.processes {
        p.rss = None;
    }
    let html = page(&report);
    assert!(html.contains("<p>No traced process grew.</p>"), "{html}");
}

#[test]
fn process_names_are_escaped() {
    let mut report = server_diagnosed();
    report.report.processes[0].cmdline = "python3 <img src=x onerror=alert(1)>".to_owned();
    let html = page(&report);
    assert!(!html.contains("<img src=x"), "unescaped command");
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
}

#[test]
fn the_flame_graph_keeps_its_script_and_leaves_find_to_the_browser() {
    let html = page(&server_diagnosed());
    let flame = section(&html, "flamegraph");
    // inferno's search and zoom, started by the SVG's onload.
    assert!(flame.contains("onload=\"init(evt)\""), "{flame}");
    assert!(flame.contains("function search(term)"), "{flame}");
    assert!(flame.contains("function zoom(node)"), "{flame}");
    assert!(flame.contains("var fluiddrawing = false"), "{flame}");
    assert!(flame.contains(FIND_KEYS_SCRIPT), "{flame}");
    // In the capture phase: before inferno's listener on the window.
    assert!(FIND_KEYS_SCRIPT.contains("}, true);"));
}

#[test]
fn the_header_says_where_and_when_what_attaching_hid_and_how_the_command_ended() {
    let mut report = lifecycle_diagnosed();
    report.report.meta.command_status = Some(ExitStatus::Signal {
        signal: 9,
        core_dumped: false,
        oom_killed: false,
    });
    let html = page(&report);
    let header_end = html.find("</header>").expect("a header");
    let run_lines: Vec<&str> = html[header_end..]
        .lines()
        .filter(|l| l.starts_with("<p class=\"run\">"))
        .collect();
    assert_eq!(
        run_lines,
        [
            "<p class=\"run\">memtrace: recorded on build-7 at 2026-01-02T03:04:05Z by \
             memtrace 0.1.0</p>"
                .to_owned(),
            format!(
                "<p class=\"run\">memtrace: {}</p>",
                escape(&text::attach_line(&report.report.meta).unwrap())
            ),
            "<p class=\"run\">memtrace: the command ended: SIGKILL (memtrace exits with 137, as \
             a shell would)</p>"
                .to_owned(),
        ],
        "{}",
        &html[..html.find("class=\"first\"").unwrap()]
    );
}
