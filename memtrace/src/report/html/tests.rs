//! Tests of the HTML renderer: escaping, the order of the sections, the
//! process tree, the RSS charts (marks, lines, shading) and the top paths,
//! on the report fixtures.

use super::*;
use crate::aggregate::test_support::prefork_report;
use crate::aggregate::Weight;
use crate::report::fixtures::server_diagnosed;
use crate::report::fixtures::{lifecycle_diagnosed, lifecycle_report};

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

#[test]
fn escape_covers_markup_and_quotes() {
    assert_eq!(
        escape(r#"<a href="x">'&'</a>"#),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    );
}

#[test]
fn sections_come_in_order_with_the_diagnosis_first() {
    let html = page(&server_diagnosed());
    let at = |needle: &str| html.find(needle).unwrap_or_else(|| panic!("no {needle}"));
    assert!(at("id=\"diagnosis\"") < at("id=\"processes\""));
    assert!(at("id=\"processes\"") < at("id=\"rss\""));
    assert!(at("id=\"rss\"") < at("id=\"paths\""));
    assert!(at("id=\"paths\"") < at("id=\"flamegraph\""));
    assert!(at("id=\"flamegraph\"") < at("id=\"warnings\""));
    assert!(!html.contains("<?xml"), "prologue inside the page");
    assert!(!html.contains("src=\"http"), "network reference");
    assert!(!html.contains("href=\"http"), "network reference");
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
    assert!(etl.contains("class=\"exec-mark\""), "{etl}");
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
    // 4 s of an 8 s axis.
    let plot_w = CHART_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    assert!(
        (last_x - (MARGIN_LEFT + plot_w / 2.0)).abs() < 0.1,
        "{points}"
    );
}

#[test]
fn top_paths_show_three_measures_and_follow_the_weight() {
    let report = lifecycle_diagnosed();
    let html = page(&report);
    let paths = &html[html.find("id=\"paths\"").unwrap()..html.find("id=\"flamegraph\"").unwrap()];
    assert!(
        paths.contains(
            "<li><b>60.0 MiB</b> held at peak, <b>60.0 MiB</b> held at end, <b>60.0 MiB</b> \
             grown (40.0% of all held at peak) in tgid 202, image 0"
        ),
        "{paths}"
    );
    assert!(
        paths.contains(
            "<b>40.0 MiB</b> held at peak, <b>30.0 MiB</b> held at end, <b>40.0 MiB</b> \
             grown (26.7% of all held at peak) in tgid 201, tgid 201#2"
        ),
        "{paths}"
    );
    let grown = page_with(
        &report,
        &RenderOptions {
            weight: Weight::Grown,
            ..RenderOptions::default()
        },
    );
    let first = &grown[grown.find("<ol>\n<li>").unwrap()..];
    assert!(
        first.starts_with(
            "<ol>\n<li><b>50.0 MiB</b> held at peak, <b>40.0 MiB</b> held at end, \
             <b>120.0 MiB</b> grown (54.5% of all grown) in tgid 201"
        ),
        "{first}"
    );
    assert!(grown.contains("weighed by bytes grown"), "{grown}");
}

#[test]
fn process_names_are_escaped() {
    let mut report = server_diagnosed();
    report.report.processes[0].cmdline = "python3 <script>alert(1)</script>".to_owned();
    let html = page(&report);
    assert!(!html.contains("<script>alert"), "unescaped command");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
}
