//! Speedscope renderer of the report step: speedscope's own file format
//! (schema <https://www.speedscope.app/file-format-schema.json>, types in
//! speedscope's `src/lib/file-format-spec.ts`), which speedscope.app and the
//! `speedscope` npm package open. Frames are shared; each process image with
//! sampled bytes is one "sampled" profile whose weights are bytes (held at
//! the high-water mark by default, `--weight`).

use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::aggregate::{Frame, PathReport, ProcessReport, Report, Weight};
use crate::diagnose::Diagnosed;

/// The `$schema` value every speedscope file carries.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// A speedscope file (`FileFormat.File`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: String,
    active_profile_index: usize,
    exporter: String,
}

/// Data shared by the profiles.
#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SpeedscopeFrame<'a>>,
}

/// `FileFormat.Frame`: a name and, for Python, the file and line.
#[derive(Serialize)]
struct SpeedscopeFrame<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

/// `FileFormat.SampledProfile` with unit `bytes`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    /// Stacks as indices into the shared frames, outermost first.
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// Writes `report` as a speedscope file (compact JSON and a newline): one
/// sampled profile per process image with `weight` bytes (in the order of
/// [`Report::processes`], named `<command> (tgid N)` with
/// [`ProcessReport::name`], so two processes on one tgid are two profiles),
/// one sample per path weighted by its `weight` bytes, `endValue` the
/// image's total. The file's name says the weight and the top finding. The
/// profile shown first is the image with the most bytes (the first of
/// them on a tie). Deterministic: frames are numbered in order of first
/// use.
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Diagnosed, weight: Weight, out: &mut dyn Write) -> io::Result<()> {
    let file = build(report, weight);
    serde_json::to_writer(&mut *out, &file)?;
    writeln!(out)
}

fn build(report: &Diagnosed, weight: Weight) -> File<'_> {
    let mut frames = FrameTable::default();
    let mut profiles = Vec::new();
    let mut active = (0, 0);
    for process in &report.processes {
        let Some(profile) = profile(report, process, weight, &mut frames) else {
            continue;
        };
        if profile.end_value > active.1 {
            active = (profiles.len(), profile.end_value);
        }
        profiles.push(profile);
    }
    File {
        schema: SCHEMA,
        shared: Shared {
            frames: frames.frames,
        },
        profiles,
        name: file_name(report, weight),
        active_profile_index: active.0,
        exporter: format!("memtrace {}", env!("CARGO_PKG_VERSION")),
    }
}

/// The file's name, shown as speedscope's title: the run, and the top
/// diagnosis finding's summary when there is one.
fn file_name(report: &Diagnosed, weight: Weight) -> String {
    let run = format!(
        "memtrace: memory {} by `{}`",
        weight.describe(),
        report.meta.command
    );
    match report.diagnosis.first() {
        Some(finding) => format!("{run}: {}", finding.summary),
        None => run,
    }
}

/// The profile of `process`; `None` when it has no `weight` bytes.
fn profile<'a>(
    report: &'a Report,
    process: &ProcessReport,
    weight: Weight,
    frames: &mut FrameTable<'a>,
) -> Option<SampledProfile> {
    let paths: Vec<&PathReport> = report
        .paths
        .iter()
        .filter(|p| p.process == process.id && p.weight_bytes(weight) > 0)
        .collect();
    if paths.is_empty() {
        return None;
    }
    let samples = paths
        .iter()
        .map(|p| {
            report
                .frames(p.stack)
                .iter()
                .map(|f| frames.index(f))
                .collect()
        })
        .collect();
    let weights: Vec<u64> = paths.iter().map(|p| p.weight_bytes(weight)).collect();
    Some(SampledProfile {
        kind: "sampled",
        name: format!("{} ({})", process.label(), process.name()),
        unit: "bytes",
        start_value: 0,
        end_value: weights.iter().fold(0, |sum: u64, w| sum.saturating_add(*w)),
        samples,
        weights,
    })
}

/// Shared frames in order of first use, each once.
#[derive(Default)]
struct FrameTable<'a> {
    frames: Vec<SpeedscopeFrame<'a>>,
    index: HashMap<&'a Frame, usize>,
}

impl<'a> FrameTable<'a> {
    /// Index of `frame`, added on first use.
    fn index(&mut self, frame: &'a Frame) -> usize {
        if let Some(index) = self.index.get(frame) {
            return *index;
        }
        let index = self.frames.len();
        self.frames.push(speedscope_frame(frame));
        self.index.insert(frame, index);
        index
    }
}

/// Python frames keep file and line (speedscope shows them); native and
/// unknown frames are names only.
fn speedscope_frame(frame: &Frame) -> SpeedscopeFrame<'_> {
    match frame {
        Frame::Python {
            function,
            file,
            line,
        } => SpeedscopeFrame {
            name: function.clone(),
            file: Some(file),
            line: Some(*line),
        },
        Frame::Native { symbol, .. } => SpeedscopeFrame {
            name: symbol.clone(),
            file: None,
            line: None,
        },
        Frame::Mapping { .. } | Frame::Unknown { .. } => SpeedscopeFrame {
            name: frame.to_string(),
            file: None,
            line: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::prefork_diagnosed;

    fn rendered(report: &Diagnosed, weight: Weight) -> Value {
        let mut out = Vec::new();
        render(report, weight, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    fn names(value: &Value) -> Vec<&str> {
        value["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn one_sampled_profile_per_process_with_bytes() {
        let value = rendered(&prefork_diagnosed(), Weight::Peak);
        assert_eq!(value["$schema"], SCHEMA);
        // The master (100) has no sampled bytes: no profile.
        assert_eq!(
            names(&value),
            [
                "gunicorn app:wsgi (tgid 101)",
                "gunicorn app:wsgi (tgid 102)",
                "gunicorn app:wsgi (tgid 103)"
            ]
        );
        let first = &value["profiles"][0];
        assert_eq!(first["type"], "sampled");
        assert_eq!(first["unit"], "bytes");
        assert_eq!(first["startValue"], 0);
        assert_eq!(first["weights"], json!([16 * MIB, 10 * MIB]));
        assert_eq!(first["endValue"], 26 * MIB);
        assert_eq!(value["activeProfileIndex"], 0);
    }

    #[test]
    fn the_weight_sets_the_weights_and_which_images_have_a_profile() {
        let report = lifecycle_diagnosed();
        let peak = rendered(&report, Weight::Peak);
        assert_eq!(
            names(&peak),
            [
                "python3 etl.py (tgid 202, image 0)",
                "python3 -m app (tgid 201)",
                "python3 -m app (tgid 201#2)"
            ]
        );
        let weights = |value: &Value, index: usize| -> Vec<u64> {
            value["profiles"][index]["weights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_u64().unwrap() / MIB)
                .collect()
        };
        assert_eq!(weights(&peak, 1), [50, 10]);
        // The ETL image holds the most (60 MiB) and is shown first.
        assert_eq!(peak["activeProfileIndex"], 0);
        let grown = rendered(&report, Weight::Grown);
        assert_eq!(weights(&grown, 1), [120, 10]);
        assert_eq!(grown["profiles"][1]["endValue"], 130 * MIB);
        // tgid 201 grew the most (130 MiB).
        assert_eq!(grown["activeProfileIndex"], 1);
        let end = rendered(&report, Weight::End);
        assert_eq!(weights(&end, 1), [40]);
        assert!(
            end["name"]
                .as_str()
                .unwrap()
                .starts_with("memtrace: memory held at end by `python3 -m app`: "),
            "{end}"
        );
    }

    #[test]
    fn the_file_name_carries_the_weight_and_top_finding() {
        let report = prefork_diagnosed();
        let summary = &report.diagnosis[0].summary;
        let value = rendered(&report, Weight::Peak);
        assert_eq!(
            value["name"],
            format!("memtrace: memory held at peak by `gunicorn app:wsgi`: {summary}")
        );
        let mut undiagnosed = report.clone();
        undiagnosed.diagnosis.clear();
        assert_eq!(
            rendered(&undiagnosed, Weight::Grown)["name"],
            "memtrace: memory grown by `gunicorn app:wsgi`"
        );
    }

    #[test]
    fn frames_are_shared_and_stacks_run_outermost_first() {
        let value = rendered(&prefork_diagnosed(), Weight::Peak);
        let frames = value["shared"]["frames"].as_array().unwrap();
        // <module>, parse, malloc, handle, append, PyList_Append: each once.
        assert_eq!(frames.len(), 6, "{frames:?}");
        assert_eq!(
            frames[0],
            json!({"name": "<module>", "file": "server.py", "line": 1})
        );
        let leak_in_102 = &value["profiles"][1]["samples"][0];
        let names: Vec<&str> = leak_in_102
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                frames[i.as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["<module>", "handle", "append", "PyList_Append"]);
        assert_eq!(value["profiles"][2]["samples"][0], *leak_in_102);
    }
}
