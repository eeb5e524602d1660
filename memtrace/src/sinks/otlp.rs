//! OTLP profiles encoder of the sinks step: a [`Window`] as one
//! `ExportProfilesServiceRequest` (OTLP `v1development`, proto v1.10.0 as
//! the `opentelemetry-proto` crate 0.33.1 generates it, the revision the
//! tests' collector 0.152.0 speaks) for `POST /v1development/profiles`
//! (`application/x-protobuf`). One `ResourceProfiles` per process, its
//! resource attributes `service.name`, `host.name`, `process.pid` and, on
//! Kubernetes, `k8s.pod.uid` and `container.id`, with one `Profile` per
//! sample type (the proto gives a profile a single sample type). The
//! string, function, location and stack tables live in the request's
//! `ProfilesDictionary`, each with the empty zero entry the proto requires.

use std::collections::HashMap;

use anyhow::Result;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, Line, Link, Location, Mapping, Profile, ProfilesDictionary, ResourceProfiles, Sample,
    ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::queue::{Encode, Request};
use super::samples::{function_file_line, process_samples, PERIOD_TYPE, SAMPLE_TYPES};
use super::window::{ProcessWindow, Window};
use crate::aggregate::Frame;

/// The request path of OTLP profiles over HTTP.
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// Turns windows into OTLP profiles export requests.
#[derive(Debug, Clone)]
pub struct OtlpEncoder {
    url: String,
}

impl OtlpEncoder {
    /// Requests to `base_url` (e.g. `http://collector:4318`; the profiles
    /// path is appended unless the URL already ends with it).
    pub fn new(base_url: &str) -> Self {
        let base = base_url.trim_end_matches('/');
        let url = if base.ends_with(PROFILES_PATH) {
            base.to_owned()
        } else {
            format!("{base}{PROFILES_PATH}")
        };
        Self { url }
    }
}

impl Encode for OtlpEncoder {
    fn requests(&self, window: &Window) -> Result<Vec<Request>> {
        Ok(vec![Request {
            url: self.url.clone(),
            query: Vec::new(),
            headers: vec![("Content-Type", "application/x-protobuf".to_owned())],
            body: export_request(window).encode_to_vec(),
        }])
    }
}

/// The export request of `window`: every process with a path.
pub fn export_request(window: &Window) -> ExportProfilesServiceRequest {
    let mut dictionary = DictionaryBuilder::new();
    let resource_profiles = window
        .processes
        .iter()
        .filter(|process| process_samples(process).next().is_some())
        .map(|process| resource_profiles(window, process, &mut dictionary))
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dictionary.dictionary),
    }
}

/// One process's profiles, one per sample type.
fn resource_profiles(
    window: &Window,
    process: &ProcessWindow,
    dictionary: &mut DictionaryBuilder,
) -> ResourceProfiles {
    let stacks: Vec<(i32, [i64; 4])> = process_samples(process)
        .map(|sample| (dictionary.stack(sample.frames), sample.values))
        .collect();
    let period_type = Some(dictionary.value_type(PERIOD_TYPE));
    let profiles = SAMPLE_TYPES
        .iter()
        .enumerate()
        .map(|(type_index, sample_type)| Profile {
            sample_type: Some(dictionary.value_type(*sample_type)),
            samples: stacks
                .iter()
                .filter(|(_, values)| values[type_index] != 0)
                .map(|(stack_index, values)| Sample {
                    stack_index: *stack_index,
                    values: vec![values[type_index]],
                    ..Sample::default()
                })
                .collect(),
            time_unix_nano: window.start_ns,
            duration_nano: window.end_ns.saturating_sub(window.start_ns),
            period_type,
            period: i64::try_from(window.sample_interval_bytes).unwrap_or(i64::MAX),
            profile_id: profile_id(window, process, type_index),
            ..Profile::default()
        })
        .collect();
    ResourceProfiles {
        resource: Some(Resource {
            attributes: resource_attributes(window, process),
            ..Resource::default()
        }),
        scope_profiles: vec![ScopeProfiles {
            scope: Some(InstrumentationScope {
                name: "memtrace".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                ..InstrumentationScope::default()
            }),
            profiles,
            schema_url: String::new(),
        }],
        schema_url: String::new(),
    }
}

/// `service.name`, `host.name`, `process.pid`, and `k8s.pod.uid` and
/// `container.id` when the cgroup path names them (semantic conventions).
fn resource_attributes(window: &Window, process: &ProcessWindow) -> Vec<KeyValue> {
    let labels = &process.labels;
    let text = |key: &str, value: &str| KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    };
    let mut attributes = vec![
        text("service.name", &labels.service_name),
        text("host.name", &window.host_name),
        KeyValue {
            key: "process.pid".to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(i64::from(labels.pid))),
            }),
            ..KeyValue::default()
        },
    ];
    if let Some(uid) = &labels.pod_uid {
        attributes.push(text("k8s.pod.uid", uid));
    }
    if let Some(id) = &labels.container_id {
        attributes.push(text("container.id", id));
    }
    attributes
}

/// A 16-byte id unique per (process, window, sample type): the pid and the
/// window's end, with the process's start time and the type mixed in.
fn profile_id(window: &Window, process: &ProcessWindow, type_index: usize) -> Vec<u8> {
    let pid_and_type = (u64::from(process.labels.pid) << 8) | (type_index as u64 & 0xff);
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(&(pid_and_type ^ process.labels.start_time_ns).to_be_bytes());
    id.extend_from_slice(&window.end_ns.to_be_bytes());
    id
}

/// The request's shared tables, each entry added once on first use; every
/// table starts with its empty zero entry.
struct DictionaryBuilder {
    dictionary: ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(String, String), i32>,
    locations: HashMap<Frame, i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl DictionaryBuilder {
    fn new() -> Self {
        let mut builder = Self {
            dictionary: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Link::default()],
                string_table: Vec::new(),
                attribute_table: vec![Default::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
        };
        builder.string("");
        builder
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> ValueType {
        ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }

    /// Index of the stack of `frames` (root first; the stack lists its
    /// locations leaf first, as pprof does).
    fn stack(&mut self, frames: &[Frame]) -> i32 {
        let location_indices: Vec<i32> = frames.iter().rev().map(|f| self.location(f)).collect();
        if let Some(index) = self.stacks.get(&location_indices) {
            return *index;
        }
        let index = next_index(self.dictionary.stack_table.len());
        self.dictionary.stack_table.push(Stack {
            location_indices: location_indices.clone(),
        });
        self.stacks.insert(location_indices, index);
        index
    }

    fn location(&mut self, frame: &Frame) -> i32 {
        if let Some(index) = self.locations.get(frame) {
            return *index;
        }
        let (name, file, line) = function_file_line(frame);
        let function_index = self.function(name, file);
        let index = next_index(self.dictionary.location_table.len());
        self.dictionary.location_table.push(Location {
            lines: vec![Line {
                function_index,
                line,
                column: 0,
            }],
            ..Location::default()
        });
        self.locations.insert(frame.clone(), index);
        index
    }

    fn function(&mut self, name: String, file: String) -> i32 {
        if let Some(index) = self.functions.get(&(name.clone(), file.clone())) {
            return *index;
        }
        let index = next_index(self.dictionary.function_table.len());
        let name_strindex = self.string(&name);
        let filename_strindex = self.string(&file);
        self.dictionary.function_table.push(Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line: 0,
        });
        self.functions.insert((name, file), index);
        index
    }

    fn string(&mut self, text: &str) -> i32 {
        if let Some(index) = self.strings.get(text) {
            return *index;
        }
        let index = next_index(self.dictionary.string_table.len());
        self.dictionary.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }
}

/// The index of the entry after `len` ones, saturated.
fn next_index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}
