//! pprof renderer of the report step: a gzipped `perftools.profiles.Profile`
//! protocol buffer, as read by `go tool pprof` and Grafana Pyroscope. The
//! messages are written with prost from hand-written structs whose field
//! numbers and types are those of
//! <https://github.com/google/pprof/blob/main/proto/profile.proto> (fields
//! memtrace does not use are left out; protobuf readers treat absent fields
//! as their defaults).

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use crate::aggregate::{Frame, Weight};
use crate::diagnose::Diagnosed;

/// Sample types, in the order of each sample's values, all sampled bytes:
/// held at the process image's high-water mark, held at its end (named
/// like Go's heap profile `inuse_space`), grown (every first touch, like
/// `alloc_space`) and copy-on-write un-sharing.
const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("peak_space", "bytes"),
    ("inuse_space", "bytes"),
    ("alloc_space", "bytes"),
    ("cow_space", "bytes"),
];

/// The sample type `--weight` picks as the default one.
fn default_sample_type(weight: Weight) -> &'static str {
    match weight {
        Weight::Peak => SAMPLE_TYPES[0].0,
        Weight::End => SAMPLE_TYPES[1].0,
        Weight::Grown => SAMPLE_TYPES[2].0,
    }
}

/// `Profile` (profile.proto fields 1, 2, 4, 5, 6, 10, 11, 12, 13, 14).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Profile {
    /// What each sample value means.
    #[prost(message, repeated, tag = "1")]
    pub(crate) sample_type: Vec<ValueType>,
    /// One sample per (process, stack).
    #[prost(message, repeated, tag = "2")]
    pub(crate) sample: Vec<Sample>,
    /// One location per distinct frame.
    #[prost(message, repeated, tag = "4")]
    pub(crate) location: Vec<Location>,
    /// One function per distinct (name, file).
    #[prost(message, repeated, tag = "5")]
    pub(crate) function: Vec<Function>,
    /// Every string; `string_table[0]` is `""`.
    #[prost(string, repeated, tag = "6")]
    pub(crate) string_table: Vec<String>,
    /// Length of the trace, in nanoseconds.
    #[prost(int64, tag = "10")]
    pub(crate) duration_nanos: i64,
    /// What the sampling period counts (`space`/`bytes`).
    #[prost(message, optional, tag = "11")]
    pub(crate) period_type: Option<ValueType>,
    /// Mean bytes between samples.
    #[prost(int64, tag = "12")]
    pub(crate) period: i64,
    /// Free text (the diagnosis), as string-table indices.
    #[prost(int64, repeated, tag = "13")]
    pub(crate) comment: Vec<i64>,
    /// String-table index of the sample type shown by default.
    #[prost(int64, tag = "14")]
    pub(crate) default_sample_type: i64,
}

/// `ValueType` (fields 1, 2): string-table indices of a type and its unit.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ValueType {
    /// e.g. `peak_space`.
    #[prost(int64, tag = "1")]
    pub(crate) r#type: i64,
    /// e.g. `bytes`.
    #[prost(int64, tag = "2")]
    pub(crate) unit: i64,
}

/// `Sample` (fields 1, 2, 3).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Sample {
    /// Location ids, leaf (innermost frame) first.
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub(crate) value: Vec<i64>,
    /// `tgid` (number), `process` (command) and `instance` (name) labels.
    #[prost(message, repeated, tag = "3")]
    pub(crate) label: Vec<Label>,
}

/// `Label` (fields 1, 2, 3): a string or a number under a key.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Label {
    /// String-table index of the key.
    #[prost(int64, tag = "1")]
    pub(crate) key: i64,
    /// String-table index of a string value (0 when numeric).
    #[prost(int64, tag = "2")]
    pub(crate) str: i64,
    /// A numeric value.
    #[prost(int64, tag = "3")]
    pub(crate) num: i64,
}

/// `Location` (fields 1, 4): one frame.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Location {
    /// Nonzero id.
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// The function and line.
    #[prost(message, repeated, tag = "4")]
    pub(crate) line: Vec<Line>,
}

/// `Line` (fields 1, 2).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Line {
    /// Id of the function.
    #[prost(uint64, tag = "1")]
    pub(crate) function_id: u64,
    /// Source line (0 when unknown).
    #[prost(int64, tag = "2")]
    pub(crate) line: i64,
}

/// `Function` (fields 1, 2, 3, 4).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Function {
    /// Nonzero id.
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// String-table index of the name.
    #[prost(int64, tag = "2")]
    pub(crate) name: i64,
    /// String-table index of the name as the system knows it (same).
    #[prost(int64, tag = "3")]
    pub(crate) system_name: i64,
    /// String-table index of the source file (0 for native code).
    #[prost(int64, tag = "4")]
    pub(crate) filename: i64,
}

/// Writes `report` as a gzipped pprof profile: sample types
/// `peak_space/bytes` (held at the process image's high-water mark),
/// `inuse_space/bytes` (held at its end), `alloc_space/bytes` (grown: every
/// first touch) and `cow_space/bytes`, the default one picked by `weight`
/// (`peak_space`, `inuse_space`, `alloc_space`); one sample per (process
/// image, stack) with any of them, labelled `tgid` (number), `process` (its
/// command) and `instance` ([`crate::aggregate::ProcessReport::name`]:
/// `tgid N`, `tgid N#2`, `tgid N, image 1`), so `-tagfocus` tells two
/// processes on one tgid apart. Python frames are functions with their file
/// and line; native frames, mappings and unknown frames are functions
/// without a file. The diagnosis goes into the profile's comments (`go tool
/// pprof -comments`), one comment per line: each finding's summary,
/// evidence, code paths and next step. Deterministic (no timestamp in the
/// gzip header).
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Diagnosed, weight: Weight, out: &mut dyn Write) -> io::Result<()> {
    write_gzipped(&build(report, weight), out)
}

/// Builds the profile message of `report`.
fn build(report: &Diagnosed, weight: Weight) -> Profile {
    let mut builder = Builder::new(&SAMPLE_TYPES);
    for path in &report.paths {
        let value = vec![
            signed(path.peak_held_bytes),
            signed(path.bytes.held_now_bytes()),
            signed(path.bytes.grown_bytes()),
            signed(path.bytes.cow_bytes),
        ];
        let process = SampleProcess {
            tgid: report.tgid(path.process),
            label: &report.label(path.process),
            name: &report.name(path.process),
        };
        builder.sample(report.frames(path.stack).iter().rev(), value, &process);
    }
    let comment: Vec<String> = report
        .diagnosis
        .iter()
        .flat_map(|finding| super::text::finding_lines(report, finding))
        .collect();
    builder.finish(&ProfileMeta {
        comment,
        duration_ns: report.meta.duration_ns,
        sample_interval_bytes: report.meta.sample_interval_bytes,
        default_sample_type: default_sample_type(weight),
    })
}

/// A frame as pprof stores it: its function, file (empty for native code)
/// and line (0 when unknown). Keys of the location table: equal frames
/// share one location.
pub(crate) trait ProfileFrame: Eq + std::hash::Hash {
    /// `(function, file, line)`.
    fn function_file_line(&self) -> (String, String, i64);
}

impl ProfileFrame for Frame {
    /// Python frames with their file and line; native frames, mappings and
    /// unknown frames as names without a file.
    fn function_file_line(&self) -> (String, String, i64) {
        match self {
            Frame::Python {
                function,
                file,
                line,
            } => (function.clone(), file.clone(), i64::from(*line)),
            Frame::Native { symbol, .. } => (symbol.clone(), String::new(), 0),
            Frame::Mapping { .. } | Frame::Unknown { .. } => (self.to_string(), String::new(), 0),
        }
    }
}

impl ProfileFrame for String {
    /// A frame already written as text (allocator mode's stacks): its text
    /// is the function, without a file.
    fn function_file_line(&self) -> (String, String, i64) {
        (self.clone(), String::new(), 0)
    }
}

/// The process a sample belongs to, as its labels name it.
pub(crate) struct SampleProcess<'s> {
    /// `tgid` label (number).
    pub tgid: u32,
    /// `process` label: its command.
    pub label: &'s str,
    /// `instance` label: which process on that tgid.
    pub name: &'s str,
}

/// The profile's fields besides its samples.
pub(crate) struct ProfileMeta {
    /// Comment lines (`go tool pprof -comments`).
    pub comment: Vec<String>,
    /// Length of the trace, in ns.
    pub duration_ns: u64,
    /// Mean bytes between samples.
    pub sample_interval_bytes: u64,
    /// The sample type shown by default (one of the builder's).
    pub default_sample_type: &'static str,
}

/// Writes `profile` gzipped (no timestamp in the gzip header).
pub(crate) fn write_gzipped(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&profile.encode_to_vec())?;
    gzip.finish()?;
    Ok(())
}

/// `value` as protobuf int64, saturated.
pub(crate) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The profile's tables, each entry added once on first use; frames of
/// type `F`.
pub(crate) struct Builder<'a, F> {
    strings: StringTable,
    sample_types: Vec<ValueType>,
    label_keys: [i64; 3],
    samples: Vec<Sample>,
    locations: Vec<Location>,
    location_ids: HashMap<&'a F, u64>,
    functions: Vec<Function>,
    function_ids: HashMap<(String, String), u64>,
}

impl<'a, F: ProfileFrame> Builder<'a, F> {
    /// A profile whose samples have one value per `(type, unit)` of
    /// `sample_types`, in that order.
    pub(crate) fn new(sample_types: &[(&str, &str)]) -> Self {
        let mut builder = Self {
            strings: StringTable::default(),
            sample_types: Vec::new(),
            label_keys: [0; 3],
            samples: Vec::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
        };
        builder.strings.index("");
        builder.sample_types = sample_types
            .iter()
            .map(|(kind, unit)| builder.value_type(kind, unit))
            .collect();
        builder.label_keys = ["tgid", "process", "instance"].map(|k| builder.strings.index(k));
        builder
    }

    /// One sample of `process` at `frames` (leaf first) with `value` (one
    /// per sample type); none when every value is 0.
    pub(crate) fn sample(
        &mut self,
        frames: impl Iterator<Item = &'a F>,
        value: Vec<i64>,
        process: &SampleProcess<'_>,
    ) {
        if value.iter().all(|v| *v == 0) {
            return;
        }
        let location_id = frames.map(|frame| self.location(frame)).collect();
        let [tgid_key, process_key, instance_key] = self.label_keys;
        let label = vec![
            Label {
                key: tgid_key,
                num: i64::from(process.tgid),
                ..Label::default()
            },
            Label {
                key: process_key,
                str: self.strings.index(process.label),
                ..Label::default()
            },
            Label {
                key: instance_key,
                str: self.strings.index(process.name),
                ..Label::default()
            },
        ];
        self.samples.push(Sample {
            location_id,
            value,
            label,
        });
    }

    /// The profile, with `meta`.
    pub(crate) fn finish(mut self, meta: &ProfileMeta) -> Profile {
        let comment = meta
            .comment
            .iter()
            .map(|line| self.strings.index(line))
            .collect();
        let period_type = Some(self.value_type("space", "bytes"));
        let default_sample_type = self.strings.index(meta.default_sample_type);
        Profile {
            sample_type: self.sample_types,
            sample: self.samples,
            location: self.locations,
            function: self.functions,
            string_table: self.strings.strings,
            duration_nanos: signed(meta.duration_ns),
            period_type,
            period: signed(meta.sample_interval_bytes),
            comment,
            default_sample_type,
        }
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.strings.index(kind),
            unit: self.strings.index(unit),
        }
    }

    /// Id of the location of `frame` (ids start at 1).
    fn location(&mut self, frame: &'a F) -> u64 {
        if let Some(id) = self.location_ids.get(frame) {
            return *id;
        }
        let (name, file, line) = frame.function_file_line();
        let function_id = self.function(name, file);
        let id = next_id(self.locations.len());
        self.locations.push(Location {
            id,
            line: vec![Line { function_id, line }],
        });
        self.location_ids.insert(frame, id);
        id
    }

    /// Id of the function `name` in `file` (ids start at 1).
    fn function(&mut self, name: String, file: String) -> u64 {
        if let Some(id) = self.function_ids.get(&(name.clone(), file.clone())) {
            return *id;
        }
        let id = next_id(self.functions.len());
        let name_index = self.strings.index(&name);
        self.functions.push(Function {
            id,
            name: name_index,
            system_name: name_index,
            filename: self.strings.index(&file),
        });
        self.function_ids.insert((name, file), id);
        id
    }
}

/// The id after `len` entries: `len + 1`.
fn next_id(len: usize) -> u64 {
    u64::try_from(len).map_or(u64::MAX, |n| n.saturating_add(1))
}

/// `Profile.string_table` with its reverse index.
#[derive(Default)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    /// Index of `text`, added on first use.
    fn index(&mut self, text: &str) -> i64 {
        if let Some(index) = self.index.get(text) {
            return *index;
        }
        let index = i64::try_from(self.strings.len()).unwrap_or(i64::MAX);
        self.strings.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;

    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

    fn decoded(report: &Diagnosed, weight: Weight) -> Profile {
        let mut gz = Vec::new();
        render(report, weight, &mut gz).unwrap();
        let mut raw = Vec::new();
        GzDecoder::new(gz.as_slice()).read_to_end(&mut raw).unwrap();
        Profile::decode(raw.as_slice()).unwrap()
    }

    fn string(profile: &Profile, index: i64) -> &str {
        &profile.string_table[usize::try_from(index).unwrap()]
    }

    /// Each sample's labels as (key, number, string).
    fn labels(profile: &Profile, sample: &Sample) -> Vec<(String, i64, String)> {
        sample
            .label
            .iter()
            .map(|l| {
                (
                    string(profile, l.key).to_owned(),
                    l.num,
                    string(profile, l.str).to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn sample_types_are_the_three_measures_and_copy_on_write_in_bytes() {
        let profile = decoded(&server_diagnosed(), Weight::Peak);
        assert_eq!(profile.string_table[0], "");
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (string(&profile, t.r#type), string(&profile, t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("peak_space", "bytes"),
                ("inuse_space", "bytes"),
                ("alloc_space", "bytes"),
                ("cow_space", "bytes")
            ]
        );
        assert_eq!(profile.period, 512 * 1024);
        assert_eq!(profile.duration_nanos, 4_000_000_000);
        let period = profile.period_type.as_ref().unwrap();
        assert_eq!(
            (
                string(&profile, period.r#type),
                string(&profile, period.unit)
            ),
            ("space", "bytes")
        );
    }

    #[test]
    fn the_default_sample_type_follows_the_weight() {
        let report = server_diagnosed();
        for (weight, expected) in [
            (Weight::Peak, "peak_space"),
            (Weight::End, "inuse_space"),
            (Weight::Grown, "alloc_space"),
        ] {
            let profile = decoded(&report, weight);
            assert_eq!(
                string(&profile, profile.default_sample_type),
                expected,
                "{weight:?}"
            );
        }
    }

    #[test]
    fn one_sample_per_path_leaf_first_with_process_labels() {
        let profile = decoded(&server_diagnosed(), Weight::Peak);
        assert_eq!(profile.sample.len(), 2);
        let leak = &profile.sample[0];
        let mib = signed(36 * MIB);
        assert_eq!(leak.value, [mib, mib, mib, 4096]);
        let names: Vec<(&str, &str, i64)> = leak
            .location_id
            .iter()
            .map(|id| {
                let location = &profile.location[usize::try_from(*id - 1).unwrap()];
                let line = &location.line[0];
                let function = &profile.function[usize::try_from(line.function_id - 1).unwrap()];
                (
                    string(&profile, function.name),
                    string(&profile, function.filename),
                    line.line,
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("PyList_Append", "", 0),
                ("append", "app/cache.py", 42),
                ("handle", "app/views.py", 10),
                ("<module>", "server.py", 1)
            ]
        );
        assert_eq!(
            labels(&profile, leak),
            [
                ("tgid".to_owned(), 101, String::new()),
                ("process".to_owned(), 0, "python3 server.py".to_owned()),
                ("instance".to_owned(), 0, "tgid 101".to_owned())
            ]
        );
    }

    #[test]
    fn each_measure_has_its_value_and_processes_on_one_tgid_their_instance() {
        let profile = decoded(&lifecycle_diagnosed(), Weight::Peak);
        let mut samples: Vec<(String, Vec<i64>)> = profile
            .sample
            .iter()
            .map(|s| {
                let instance = labels(&profile, s)[2].2.clone();
                let leaf = profile.location[usize::try_from(s.location_id[1] - 1).unwrap()].line[0]
                    .function_id;
                let function = &profile.function[usize::try_from(leaf - 1).unwrap()];
                let values = s.value.iter().map(|v| v / signed(MIB)).collect();
                (
                    format!("{instance} {}", string(&profile, function.name)),
                    values,
                )
            })
            .collect();
        samples.sort();
        assert_eq!(
            samples,
            [
                ("tgid 201 append".to_owned(), vec![10, 0, 10, 0]),
                ("tgid 201 handle_job".to_owned(), vec![50, 40, 120, 0]),
                ("tgid 201#2 append".to_owned(), vec![30, 30, 30, 4]),
                ("tgid 202, image 0 load".to_owned(), vec![60, 60, 60, 0]),
            ]
        );
        let tgids: Vec<i64> = profile.sample.iter().map(|s| s.label[0].num).collect();
        assert_eq!(tgids.iter().filter(|t| **t == 201).count(), 3, "{tgids:?}");
    }

    #[test]
    fn comments_carry_each_finding_line_by_line() {
        let report = prefork_diagnosed();
        let top = &report.diagnosis[0];
        let profile = decoded(&report, Weight::Peak);
        let comments: Vec<&str> = profile
            .comment
            .iter()
            .map(|&i| string(&profile, i))
            .collect();
        assert_eq!(
            comments[0],
            crate::report::text::finding_line(&report, top),
            "{comments:#?}"
        );
        assert!(comments.iter().all(|c| !c.contains('\n')), "{comments:#?}");
        for evidence in &top.evidence {
            assert!(
                comments.contains(&format!("- {evidence}").as_str()),
                "{comments:#?}"
            );
        }
        assert!(
            comments.iter().any(|c| c.starts_with("path: ")),
            "{comments:#?}"
        );
        assert!(
            comments.contains(&format!("next step: {}", top.next_step).as_str()),
            "{comments:#?}"
        );
    }

    #[test]
    fn shared_frames_are_one_location_and_output_is_deterministic() {
        let report = server_diagnosed();
        let profile = decoded(&report, Weight::Peak);
        // <module>, handle, append, PyList_Append, parse, malloc.
        assert_eq!(profile.location.len(), 6);
        assert_eq!(profile.function.len(), 6);
        let (mut first, mut second) = (Vec::new(), Vec::new());
        render(&report, Weight::Peak, &mut first).unwrap();
        render(&report, Weight::Peak, &mut second).unwrap();
        assert_eq!(first, second);
    }
}
