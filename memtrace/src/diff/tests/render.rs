//! The table and the differential flame graph of a diff.

use super::super::flamegraph::folded;
use super::super::test_svg::{parse_svg, titles};
use super::*;
use crate::report::folded::sanitize;

fn sides() -> Sides {
    Sides {
        before: "`a.capture`".to_owned(),
        after: "`b.capture`".to_owned(),
        warnings: Vec::new(),
    }
}

#[test]
fn table_lists_processes_then_paths_with_held_and_grown_before_after_delta() {
    let (before, after) = before_after();
    let mut out = Vec::new();
    render_table(&diff(&before, &after), &sides(), 20, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("memtrace diff\n  before: `a.capture`\n  after:  `b.capture`\n"),
        "{text}"
    );
    let expected_processes = "\
BEFORE                      RSS  AFTER                       RSS        DELTA  COMMAND
tgid 101               40.0 MiB  tgid 201               70.0 MiB    +30.0 MiB  python3 app.py
tgid 100               20.0 MiB  tgid 200               20.0 MiB          0 B  python3 app.py
Total RSS of the live processes at the end: 60.0 MiB → 90.0 MiB (+30.0 MiB)
";
    assert!(text.contains(expected_processes), "{text}");
    let expected_paths = "
      HELD BEFORE   HELD AFTER   HELD DELTA  GROWN BEFORE  GROWN AFTER  GROWN DELTA
  1.     10.0 MiB     30.0 MiB    +20.0 MiB      10.0 MiB     30.0 MiB    +20.0 MiB
        append (app/cache.py:42)
        handle (app/views.py:10)
        <module> (server.py:1)
  2.          0 B      5.0 MiB     +5.0 MiB           0 B      5.0 MiB     +5.0 MiB
        render (app/html.py:3)
";
    assert!(text.contains(expected_paths), "{text}");
    assert!(
        text.contains(
            "  3.          0 B      2.0 MiB     +2.0 MiB       8.0 MiB     40.0 MiB    +32.0 MiB\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "summary: 3 paths hold more, 0 less; held at the end 10.0 MiB → 37.0 MiB \
             (+27.0 MiB); grown 18.0 MiB → 75.0 MiB (+57.0 MiB)\n"
        ),
        "{text}"
    );
}

#[test]
fn one_python_line_is_one_row_whatever_its_native_leaf() {
    let (before, _) = before_after();
    // The same Python line through another native leaf: the same row.
    let mut other_leaf = leak_stack();
    *other_leaf.last_mut().unwrap() = native("PyDict_SetItem");
    let after = run(
        200,
        201,
        70,
        &[(true, leak_stack(), 30, 30), (true, other_leaf, 6, 6)],
    );
    let d = diff(&before, &after);
    let lines = d.python_lines();
    let leak: Vec<&PathDiff> = lines
        .iter()
        .filter(|p| p.frames.last() == Some(&py("append", "app/cache.py", 42)))
        .collect();
    assert_eq!(leak.len(), 1, "{lines:#?}");
    assert_eq!(leak[0].after, bytes(36, 36));
    assert_eq!(leak[0].before, bytes(10, 10));
}

#[test]
fn sides_of_unequal_length_compare_growth_per_second_and_say_so() {
    let (mut before, after) = before_after();
    // 10 s before, 20 s after.
    before.meta.duration_ns = 10_000_000_000;
    let mut after = after;
    after.meta.duration_ns = 20_000_000_000;
    let d = diff(&before, &after);
    assert!(
        d.grown_per_second(),
        "{} vs {}",
        d.before_duration_ns,
        d.after_duration_ns
    );
    let mut out = Vec::new();
    render_table(&d, &sides(), 20, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("the sides differ in length") && text.contains("bytes per second"),
        "{text}"
    );
    assert!(text.contains("first touch, per second"), "{text}");
    let (before, after) = before_after();
    assert!(!diff(&before, &after).grown_per_second());
}

#[test]
fn empty_diffs_say_so_and_draw_no_flame_graph() {
    let empty = run(1, 2, 10, &[]);
    let d = diff(&empty, &empty);
    let mut out = Vec::new();
    render_table(&d, &sides(), 20, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("  none: no memory was held or grown with a stack on either side"),
        "{text}"
    );
    let err = render_flamegraph(&d, &sides(), Measure::HeldAtEnd, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, DiffError::NothingToDraw { .. }), "{err}");
    assert!(err.to_string().contains("held at the end"), "{err}");
}

#[test]
fn folded_sides_hold_each_stack_once_with_its_held_bytes() {
    let (before, after) = before_after();
    let d = diff(&before, &after);
    let held = |side: PathBytes| Measure::HeldAtEnd.of(side);
    let after_text = folded(&d, |p| held(p.after));
    assert_eq!(after_text.lines().count(), 3, "{after_text}");
    assert!(after_text.contains(&format!(
        "<module> (server.py:1);handle (app/views.py:10);append (app/cache.py:42);PyList_Append {}\n",
        30 * MIB
    )), "{after_text}");
    // parse holds nothing before: only the leak.
    let before_text = folded(&d, |p| held(p.before));
    assert_eq!(before_text.lines().count(), 1, "{before_text}");
    assert_eq!(sanitize("a;b\nc"), "a:b c");
}

/// The tooltip of the first frame whose title starts with `name (`.
fn tooltip(svg: &str, name: &str) -> String {
    let doc = parse_svg(svg);
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let found = titles(&doc)
        .into_iter()
        .find(|t| t.starts_with(&format!("{name} (")))
        .map(str::to_owned);
    found.unwrap_or_else(|| panic!("no `{name}` frame"))
}

#[test]
fn differential_flame_graph_weighs_held_bytes_by_default_and_grown_on_request() {
    let (before, after) = before_after();
    let d = diff(&before, &after);
    let mut out = Vec::new();
    render_flamegraph(&d, &sides(), Measure::default(), &mut out).unwrap();
    let svg = String::from_utf8(out).unwrap();
    // inferno's differential tooltips: `name (N bytes, share; +delta%)`.
    let leaf = tooltip(&svg, "PyList_Append");
    assert!(
        leaf.contains("31,457,280 bytes") && leaf.contains("; +"),
        "{leaf}"
    );
    let parse = tooltip(&svg, "parse (app/io.py:7)");
    assert!(parse.contains("2,097,152 bytes"), "{parse}");
    assert!(svg.contains("`a.capture` → `b.capture`"), "{svg}");
    assert!(svg.contains("memory held at the end"), "{svg}");

    let mut out = Vec::new();
    render_flamegraph(&d, &sides(), Measure::Grown, &mut out).unwrap();
    let svg = String::from_utf8(out).unwrap();
    let parse = tooltip(&svg, "parse (app/io.py:7)");
    assert!(parse.contains("41,943,040 bytes"), "{parse}");
}

#[test]
fn memory_held_only_before_draws_nothing() {
    let (before, _) = before_after();
    let churn = run(1, 2, 10, &[(true, leak_stack(), 50, 0)]);
    let d = diff(&before, &churn);
    let err = render_flamegraph(&d, &sides(), Measure::HeldAtEnd, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            DiffError::NothingToDraw {
                measure: Measure::HeldAtEnd
            }
        ),
        "{err}"
    );
    // What grew is still drawn when asked for.
    render_flamegraph(&d, &sides(), Measure::Grown, &mut Vec::new()).unwrap();
}
