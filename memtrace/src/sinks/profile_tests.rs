//! Tests of the profile encoders (OTLP, Pyroscope) on synthetic windows,
//! decoded back, and of the delivery queue against real local sockets.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::time::Duration;

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

use super::otlp::{export_request, OtlpEncoder};
use super::pyroscope::{series_name, PyroscopeEncoder};
use super::queue::{Encode, Policy, QueuedSink};
use super::samples::by_service_and_role;
use super::window::{PathWindow, ProcessLabels, ProcessWindow, Sink, Window};
use crate::aggregate::Frame;
use crate::report::pprof::Profile as PprofProfile;

const MIB: u64 = 1 << 20;

fn python(function: &str, line: u32) -> Frame {
    Frame::Python {
        function: function.to_owned(),
        file: "app.py".to_owned(),
        line,
    }
}

fn process(pid: u32, role: &str, paths: Vec<PathWindow>) -> ProcessWindow {
    ProcessWindow {
        labels: ProcessLabels {
            service_name: "api".to_owned(),
            role: role.to_owned(),
            pid,
            start_time_ns: 1_000,
            cgroup: "/".to_owned(),
            pod_uid: None,
            container_id: None,
        },
        resident_bytes: 100 * MIB,
        paths,
        ..ProcessWindow::default()
    }
}

/// A master holding nothing new, a worker in a pod with two paths (one
/// sharing the `<module>` frame), and a worker with nothing at all.
fn window() -> Window {
    let render = PathWindow {
        frames: vec![
            python("<module>", 1),
            python("handle", 10),
            python("render_report", 84),
        ],
        held_bytes: 40 * MIB,
        grown_bytes: 8 * MIB,
        peak_held_bytes: 42 * MIB,
        cow_bytes: 0,
    };
    let parse = PathWindow {
        frames: vec![python("<module>", 1), python("parse", 20)],
        held_bytes: 0,
        grown_bytes: MIB,
        peak_held_bytes: 0,
        cow_bytes: 4096,
    };
    let mut worker = process(11, "worker", vec![render, parse]);
    worker.labels.pod_uid = Some("0f1e".to_owned());
    worker.labels.container_id = Some("c0ffee".to_owned());
    let import = PathWindow {
        frames: vec![python("<module>", 1), python("load", 5)],
        held_bytes: 2 * MIB,
        peak_held_bytes: 2 * MIB,
        ..PathWindow::default()
    };
    Window {
        start_ns: 1_700_000_000_000_000_000,
        end_ns: 1_700_000_015_500_000_000,
        host_name: "node-1".to_owned(),
        processes: vec![
            process(10, "master", vec![import]),
            worker,
            process(12, "worker", Vec::new()),
        ],
        sample_interval_bytes: 512 * 1024,
        ..Window::default()
    }
}

/// `(key, value as text)` of a resource's attributes.
fn attributes(
    resource: &opentelemetry_proto::tonic::resource::v1::Resource,
) -> Vec<(String, String)> {
    resource
        .attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(n)) => n.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[test]
fn otlp_has_a_resource_per_process_with_its_attributes_and_a_profile_per_type() {
    let bytes = OtlpEncoder::new("http://collector:4318/")
        .requests(&window())
        .unwrap();
    assert_eq!(bytes.len(), 1);
    assert_eq!(bytes[0].url, "http://collector:4318/v1development/profiles");
    let request = ExportProfilesServiceRequest::decode(bytes[0].body.as_slice()).unwrap();
    // The worker with no path sends nothing.
    assert_eq!(request.resource_profiles.len(), 2);
    let worker = &request.resource_profiles[1];
    assert_eq!(
        attributes(worker.resource.as_ref().unwrap()),
        [
            ("service.name", "api"),
            ("host.name", "node-1"),
            ("process.pid", "11"),
            ("k8s.pod.uid", "0f1e"),
            ("container.id", "c0ffee"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    let master = &request.resource_profiles[0];
    assert_eq!(attributes(master.resource.as_ref().unwrap()).len(), 3);
    let dictionary = request.dictionary.as_ref().unwrap();
    let string = |i: i32| dictionary.string_table[usize::try_from(i).unwrap()].as_str();
    let profiles = &worker.scope_profiles[0].profiles;
    let types: Vec<(&str, &str)> = profiles
        .iter()
        .map(|p| {
            let t = p.sample_type.unwrap();
            (string(t.type_strindex), string(t.unit_strindex))
        })
        .collect();
    assert_eq!(
        types,
        [
            ("inuse_space", "bytes"),
            ("alloc_space", "bytes"),
            ("peak_space", "bytes"),
            ("cow_space", "bytes")
        ]
    );
    let values: Vec<Vec<i64>> = profiles
        .iter()
        .map(|p| p.samples.iter().flat_map(|s| s.values.clone()).collect())
        .collect();
    let mib = 1 << 20;
    assert_eq!(
        values,
        [
            vec![40 * mib],
            vec![8 * mib, mib],
            vec![42 * mib],
            vec![4096]
        ]
    );
    assert_eq!(profiles[0].time_unix_nano, 1_700_000_000_000_000_000);
    assert_eq!(profiles[0].duration_nano, 15_500_000_000);
    let period_type = profiles[0].period_type.unwrap();
    assert_eq!(
        (
            string(period_type.type_strindex),
            string(period_type.unit_strindex),
            profiles[0].period
        ),
        ("space", "bytes", 512 * 1024),
        "the sampling period: --sample-bytes"
    );
    let ids: std::collections::HashSet<&Vec<u8>> = request
        .resource_profiles
        .iter()
        .flat_map(|r| r.scope_profiles[0].profiles.iter().map(|p| &p.profile_id))
        .collect();
    assert_eq!(ids.len(), 8, "profile ids are unique");
    assert!(ids.iter().all(|id| id.len() == 16));
}

#[test]
fn otlp_stacks_resolve_leaf_first_through_the_shared_dictionary() {
    let request = export_request(&window());
    let dictionary = request.dictionary.unwrap();
    // Every table starts with its zero entry.
    assert_eq!(dictionary.string_table[0], "");
    assert_eq!(dictionary.function_table[0], Default::default());
    assert_eq!(dictionary.location_table[0], Default::default());
    assert_eq!(dictionary.stack_table[0], Default::default());
    assert_eq!(dictionary.mapping_table.len(), 1);
    let at = |i: i32| usize::try_from(i).unwrap();
    let sample = &request.resource_profiles[1].scope_profiles[0].profiles[0].samples[0];
    let names: Vec<(&str, i64)> = dictionary.stack_table[at(sample.stack_index)]
        .location_indices
        .iter()
        .map(|&l| {
            let line = &dictionary.location_table[at(l)].lines[0];
            let function = &dictionary.function_table[at(line.function_index)];
            (
                dictionary.string_table[at(function.name_strindex)].as_str(),
                line.line,
            )
        })
        .collect();
    assert_eq!(
        names,
        [("render_report", 84), ("handle", 10), ("<module>", 1)]
    );
    // <module> is one location for the three paths that share it:
    // <module>, handle, render_report, parse, load.
    assert_eq!(dictionary.location_table.len(), 1 + 5);
}

#[test]
fn pyroscope_sends_one_pprof_per_service_and_role() {
    let encoder = PyroscopeEncoder::new("http://pyroscope:4040", Some("team-a".to_owned()));
    let requests = encoder.requests(&window()).unwrap();
    // api/master and api/worker (the two workers in one series).
    assert_eq!(requests.len(), 2);
    let worker = &requests[1];
    assert_eq!(worker.url, "http://pyroscope:4040/ingest");
    let query: Vec<(&str, &str)> = worker.query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        query,
        [
            ("name", "api{role=worker,host_name=node-1}"),
            ("from", "1700000000"),
            ("until", "1700000016"),
            ("format", "pprof"),
            ("spyName", "memtrace"),
        ]
    );
    assert!(worker
        .headers
        .contains(&("X-Scope-OrgID", "team-a".to_owned())));
    let mut raw = Vec::new();
    GzDecoder::new(worker.body.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let profile = PprofProfile::decode(raw.as_slice()).unwrap();
    let string = |i: i64| profile.string_table[usize::try_from(i).unwrap()].as_str();
    assert_eq!(string(profile.default_sample_type), "inuse_space");
    let values: Vec<Vec<i64>> = profile.sample.iter().map(|s| s.value.clone()).collect();
    let mib = 1 << 20;
    assert_eq!(
        values,
        [vec![40 * mib, 8 * mib, 42 * mib, 0], vec![0, mib, 0, 4096]]
    );
    assert_eq!(profile.duration_nanos, 15_500_000_000);
    let period_type = profile.period_type.as_ref().unwrap();
    assert_eq!(
        (
            string(period_type.r#type),
            string(period_type.unit),
            profile.period
        ),
        ("space", "bytes", 512 * 1024),
        "the sampling period: --sample-bytes"
    );
    assert_eq!(profile.sample[0].label[0].num, 11, "the tgid sample label");
}

#[test]
fn series_names_keep_the_label_syntax_intact() {
    assert_eq!(
        series_name("shop,{x}=1", "worker", "node-1"),
        "shop__x__1{role=worker,host_name=node-1}"
    );
    let window = window();
    let groups: Vec<(&str, &str, usize)> = by_service_and_role(&window)
        .into_iter()
        .map(|((s, r), p)| (s, r, p.len()))
        .collect();
    assert_eq!(groups, [("api", "master", 1), ("api", "worker", 2)]);
}

fn fast_policy() -> Policy {
    Policy {
        queue_windows: 2,
        attempts: 3,
        first_backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(2),
        flush_timeout: Duration::from_secs(10),
    }
}

#[test]
fn a_sink_nobody_listens_to_counts_each_attempt_and_drops_the_window() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let encoder = OtlpEncoder::new(&format!("http://127.0.0.1:{port}"));
    let mut sink = QueuedSink::start("otlp", encoder, fast_policy()).unwrap();
    sink.send(&window()).unwrap();
    let errors = wait_until(|| sink.send_errors() == 3 && sink.windows_dropped() == 1);
    assert!(
        errors,
        "errors {}, dropped {}",
        sink.send_errors(),
        sink.windows_dropped()
    );
    assert_eq!(sink.windows_sent(), 0);
}

#[test]
fn a_sink_that_answers_gets_the_window_and_a_full_queue_drops_without_blocking() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let encoder = OtlpEncoder::new(&format!("http://127.0.0.1:{port}"));
    let mut sink = QueuedSink::start("otlp", encoder, fast_policy()).unwrap();
    // Nobody accepts yet: at most one window waits in its attempt and two
    // in the queue; the rest are dropped at once.
    let started = std::time::Instant::now();
    for _ in 0..6 {
        sink.send(&window()).unwrap();
    }
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(sink.windows_dropped() >= 3, "{}", sink.windows_dropped());
    // Detached: it answers however many windows the queue kept (1 to 3).
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            answer_200(stream.unwrap());
        }
    });
    assert!(
        wait_until(|| sink.windows_sent() >= 1),
        "sent {}, errors {}",
        sink.windows_sent(),
        sink.send_errors()
    );
    let dropped = sink.windows_dropped();
    drop(sink);
    assert!(dropped >= 3, "{dropped}");
}

/// Reads one HTTP request (headers, then `Content-Length` bytes) and
/// answers 200.
fn answer_200(mut stream: std::net::TcpStream) {
    use std::io::BufRead as _;
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
}

/// Polls `done` for up to 10 s.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
