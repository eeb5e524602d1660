//! Reading flame graph SVGs back, shared by the tests that draw them:
//! tests/diff.rs and tests/formats.rs (as `#[path]` modules) and memtrace's
//! own `diff` unit tests (memtrace/src/diff.rs includes this file by path).

/// `text` parsed as XML; panics with the text when it is not well formed.
/// inferno's SVG carries the SVG 1.1 DOCTYPE, hence `allow_dtd`.
pub fn parse_svg(text: &str) -> roxmltree::Document<'_> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    roxmltree::Document::parse_with_options(text, options)
        .unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{text}"))
}

/// The text of every `<title>` of `doc` (a flame graph's frame tooltips,
/// e.g. `append (app/cache.py:42) (N bytes, …)`), in document order.
pub fn titles<'a>(doc: &'a roxmltree::Document<'_>) -> Vec<&'a str> {
    doc.descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect()
}
