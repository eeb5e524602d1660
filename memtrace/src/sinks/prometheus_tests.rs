//! Tests of the Prometheus sink: the page's text for a window, and the
//! HTTP answers of its server over a real socket.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;

use super::*;
use crate::sinks::{Health, PathWindow, ProcessLabels, ProcessWindow};

fn python(function: &str, file: &str, line: u32) -> Frame {
    Frame::Python {
        function: function.to_owned(),
        file: file.to_owned(),
        line,
    }
}

fn process(service: &str, role: &str, pid: u32, paths: Vec<PathWindow>) -> ProcessWindow {
    ProcessWindow {
        labels: ProcessLabels {
            service_name: service.to_owned(),
            role: role.to_owned(),
            pid,
            ..ProcessLabels::default()
        },
        resident_bytes: 3 << 20,
        anon_bytes: 2 << 20,
        file_bytes: 1 << 20,
        shmem_bytes: 0,
        pss_bytes: Some(1 << 20),
        uss_bytes: None,
        growth_bytes: -4096,
        cow_bytes_total: 8192,
        paths,
    }
}

fn held(frames: Vec<Frame>, held_bytes: u64) -> PathWindow {
    PathWindow {
        frames,
        held_bytes,
        ..PathWindow::default()
    }
}

fn window() -> Window {
    let leak = vec![
        python("<module>", "app.py", 1),
        python("render_report", "app.py", 84),
        python("dumps", "/usr/lib/python3.11/json/__init__.py", 231),
    ];
    let worker = |pid, bytes| process("shop", "worker", pid, vec![held(leak.clone(), bytes)]);
    Window {
        end_ns: 1_700_000_000_500_000_000,
        processes: vec![
            process("shop", "master", 10, Vec::new()),
            worker(11, 1000),
            worker(12, 24),
            process(
                "we\"ird\\name",
                "main",
                20,
                (1..=3)
                    .map(|i| held(vec![python("f", "x.py", i)], u64::from(i)))
                    .collect(),
            ),
        ],
        health: Health {
            records_read: 5,
            windows_emitted: 2,
            own_resident_bytes: 40 << 20,
            ..Health::default()
        },
        ..Window::default()
    }
}

#[test]
fn processes_are_one_sample_each_per_family_with_bounded_labels() {
    let page = render(&window(), 10);
    assert!(page.contains(
        "# TYPE memtrace_process_resident_bytes gauge\n\
         memtrace_process_resident_bytes{service_name=\"shop\",role=\"master\",pid=\"10\"} 3145728\n"
    ));
    assert!(page.contains(
        "memtrace_process_growth_bytes{service_name=\"shop\",role=\"worker\",pid=\"11\"} -4096\n"
    ));
    assert!(page.contains("# TYPE memtrace_process_cow_bytes_total counter\n"));
    assert!(
        !page.contains("memtrace_process_uss_bytes{"),
        "unknown USS is left out"
    );
    assert_eq!(
        page.matches("# TYPE memtrace_process_resident_bytes ")
            .count(),
        1
    );
}

#[test]
fn paths_are_summed_per_service_by_their_own_line_and_cut_to_top() {
    let page = render(&window(), 2);
    assert!(page.contains(
        "memtrace_path_held_bytes{service_name=\"shop\",function=\"render_report\",\
         file=\"app.py\",line=\"84\"} 1024\n"
    ));
    let weird: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("memtrace_path_held_bytes{service_name=\"we\\\"ird\\\\name\""))
        .collect();
    assert_eq!(weird.len(), 2, "top 2 of 3: {weird:?}");
    assert!(weird[0].ends_with("line=\"3\"} 3"), "{weird:?}");
}

#[test]
fn health_is_counters_and_gauges() {
    let page = render(&window(), 10);
    assert!(page
        .contains("# TYPE memtrace_records_read_total counter\nmemtrace_records_read_total 5\n"));
    assert!(page.contains("memtrace_windows_emitted_total 2\n"));
    assert!(page.contains("memtrace_resident_bytes 41943040\n"));
    assert!(page.contains("memtrace_traced_processes 4\n"));
    assert!(page.contains("memtrace_window_end_timestamp_seconds 1700000000.500\n"));
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').expect("a value");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
}

fn get(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

#[test]
fn the_server_answers_metrics_404_and_405_over_a_socket() {
    let mut sink = PrometheusSink::bind("127.0.0.1:0", 10).expect("bind");
    let addr = sink.local_addr();
    let before = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(before.starts_with("HTTP/1.1 200 OK\r\n"), "{before}");
    assert!(before.contains("memtrace_windows_emitted_total 0\n"));
    sink.send(&window()).expect("send");
    let after = get(addr, "GET /metrics?x=1 HTTP/1.1\r\nAccept: */*\r\n\r\n");
    assert!(
        after.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
        "{after}"
    );
    let body = after.split_once("\r\n\r\n").expect("a body").1;
    assert!(after.contains(&format!("Content-Length: {}\r\n", body.len())));
    assert!(body.contains("memtrace_windows_emitted_total 2\n"));
    assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    let head = get(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(head.ends_with("\r\n\r\n"), "{head}");
}

#[test]
fn addresses_are_a_port_on_loopback_or_host_and_port() {
    assert_eq!(
        parse_addr("9464").expect("port").to_string(),
        "127.0.0.1:9464"
    );
    assert_eq!(
        parse_addr("0.0.0.0:1").expect("addr").to_string(),
        "0.0.0.0:1"
    );
    assert!(parse_addr("no such thing").is_err());
}
