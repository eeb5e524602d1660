//! Speedscope renderer of the report step: speedscope's own file format
//! (schema <https://www.speedscope.app/file-format-schema.json>, types in
//! speedscope's `src/lib/file-format-spec.ts`), which speedscope.app and the
//! `speedscope` npm package open. Frames are shared; each process image with
//! sampled bytes is one "sampled" profile whose weights are bytes (held at
//! the high-water mark by default, `--weight`).

use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::aggregate::{Frame, Weight};
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
pub(crate) struct SpeedscopeFrame<'a> {
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
/// [`Report::processes`](crate::aggregate::Report::processes), named
/// `<command> (tgid N)` with
/// [`ProcessReport::name`](crate::aggregate::ProcessReport::name), so two processes on one tgid are two profiles),
/// one sample per path weighted by its `weight` bytes, `endValue` the
/// image's total. The file's name says the weight and the top finding. The
/// profile shown first is the image with the most bytes (the first of
/// them on a tie). Deterministic: frames are numbered in order of first
/// use.
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Diagnosed, weight: Weight, out: &mut dyn Write) -> io::Result<()> {
    let mut file = FileBuilder::default();
    for process in &report.processes {
        let paths = report
            .paths
            .iter()
            .filter(|p| p.process == process.id)
            .map(|p| (report.frames(p.stack), p.weight_bytes(weight)));
        let name = format!("{} ({})", process.label(), process.name());
        file.profile(name, paths);
    }
    file.write(file_name(report, weight), out)
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

/// A speedscope file being built, its frames of type `F` shared by its
/// profiles.
pub(crate) struct FileBuilder<'a, F> {
    frames: FrameTable<'a, F>,
    profiles: Vec<SampledProfile>,
    /// The profile with the most bytes (the first on a tie), and its bytes.
    active: (usize, u64),
}

impl<F> Default for FileBuilder<'_, F> {
    fn default() -> Self {
        Self {
            frames: FrameTable {
                frames: Vec::new(),
                index: HashMap::new(),
            },
            profiles: Vec::new(),
            active: (0, 0),
        }
    }
}

impl<'a, F: ScopeFrame> FileBuilder<'a, F> {
    /// Adds the profile `name` of `paths` (frames outermost first, bytes);
    /// paths of 0 bytes are left out, and a profile without bytes.
    pub(crate) fn profile(&mut self, name: String, paths: impl Iterator<Item = (&'a [F], u64)>) {
        let mut samples = Vec::new();
        let mut weights: Vec<u64> = Vec::new();
        for (frames, bytes) in paths.filter(|(_, bytes)| *bytes > 0) {
            samples.push(frames.iter().map(|f| self.frames.index(f)).collect());
            weights.push(bytes);
        }
        if samples.is_empty() {
            return;
        }
        let end_value = weights.iter().fold(0, |sum: u64, w| sum.saturating_add(*w));
        if end_value > self.active.1 {
            self.active = (self.profiles.len(), end_value);
        }
        self.profiles.push(SampledProfile {
            kind: "sampled",
            name,
            unit: "bytes",
            start_value: 0,
            end_value,
            samples,
            weights,
        });
    }

    /// Writes the file named `name` (compact JSON and a newline).
    pub(crate) fn write(self, name: String, out: &mut dyn Write) -> io::Result<()> {
        let file = File {
            schema: SCHEMA,
            shared: Shared {
                frames: self.frames.frames,
            },
            profiles: self.profiles,
            name,
            active_profile_index: self.active.0,
            exporter: format!("memtrace {}", env!("CARGO_PKG_VERSION")),
        };
        serde_json::to_writer(&mut *out, &file)?;
        writeln!(out)
    }
}

/// Shared frames in order of first use, each once.
struct FrameTable<'a, F> {
    frames: Vec<SpeedscopeFrame<'a>>,
    index: HashMap<&'a F, usize>,
}

impl<'a, F: ScopeFrame> FrameTable<'a, F> {
    /// Index of `frame`, added on first use.
    fn index(&mut self, frame: &'a F) -> usize {
        if let Some(index) = self.index.get(frame) {
            return *index;
        }
        let index = self.frames.len();
        self.frames.push(frame.speedscope_frame());
        self.index.insert(frame, index);
        index
    }
}

/// A frame as speedscope shows it; equal frames are one shared frame.
pub(crate) trait ScopeFrame: Eq + std::hash::Hash {
    /// Its name, and file and line when known.
    fn speedscope_frame(&self) -> SpeedscopeFrame<'_>;
}

impl ScopeFrame for Frame {
    /// Python frames keep file and line (speedscope shows them); native and
    /// unknown frames are names only.
    fn speedscope_frame(&self) -> SpeedscopeFrame<'_> {
        match self {
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
                name: self.to_string(),
                file: None,
                line: None,
            },
        }
    }
}

impl ScopeFrame for String {
    /// A frame already written as text (allocator mode's stacks): a name.
    fn speedscope_frame(&self) -> SpeedscopeFrame<'_> {
        SpeedscopeFrame {
            name: self.clone(),
            file: None,
            line: None,
        }
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
