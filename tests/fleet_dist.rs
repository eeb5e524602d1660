//! The tarball of `cargo xtask dist` (xtask/src/dist.rs), unpacked in an
//! empty folder: its binary traces a Python program with no file of the
//! workspace beside it, its systemd unit passes `systemd-analyze verify`,
//! its Prometheus scrape config loads in Prometheus 3, and its Grafana
//! dashboard queries only metrics the agent serves.

#[expect(
    dead_code,
    reason = "these tests read the unpacked tarball, not the report helpers"
)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::require_ebpf;
use serde_json::Value;

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The tarball, unpacked in a new empty folder: (folder, unpacked top
/// folder); `None` after printing why the test skips.
fn unpacked() -> Option<(tempfile::TempDir, PathBuf)> {
    let dist = workspace().join("target/dist");
    let tarball = std::fs::read_dir(&dist).ok().and_then(|entries| {
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with("-x86_64-linux.tar.gz"))
    });
    let Some(tarball) = tarball else {
        common::skip(&format!(
            "no tarball in {} (cargo xtask dist builds it)",
            dist.display()
        ));
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .current_dir(dir.path())
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -xzf {}", tarball.display());
    let top = std::fs::read_dir(dir.path())
        .expect("list")
        .next()
        .expect("one folder")
        .expect("entry")
        .path();
    Some((dir, top))
}

#[test]
fn the_tarball_holds_the_binary_readme_docs_licences_and_deploy_examples() {
    let Some((_dir, top)) = unpacked() else {
        return;
    };
    for file in [
        "memtrace",
        "README.md",
        "docs/fleet.md",
        "docs/requirements.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "examples/deploy/systemd/memtrace-agent.service",
        "examples/deploy/kubernetes/memtrace-agent.yaml",
        "examples/deploy/prometheus/prometheus.yml",
        "examples/deploy/grafana/memtrace-dashboard.json",
    ] {
        assert!(top.join(file).is_file(), "{file} missing from the tarball");
    }
}

#[test]
fn the_unpacked_binary_traces_from_an_empty_folder() {
    let python = require_ebpf!(common::python_3_11());
    let Some((dir, top)) = unpacked() else {
        return;
    };
    // The workload is copied in: nothing of the workspace is used.
    for script in ["grow_cache.py", "workload_common.py"] {
        std::fs::copy(common::script(script), dir.path().join(script)).expect("copy script");
    }
    let out = Command::new(top.join("memtrace"))
        .args(["run", "-q", "--output-dir", "out", "--"])
        .arg(&python)
        .args(["grow_cache.py", "--mib", "64", "--hold", "1"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("run the unpacked memtrace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_dir(dir.path().join("out"))
        .expect("report folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("a JSON report");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(report).expect("read")).expect("JSON");
    let functions: Vec<String> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s.as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["function"].as_str().map(str::to_owned))
        .collect();
    assert!(functions.iter().any(|f| f == "fill_cache"), "{functions:?}");
}

#[test]
fn the_systemd_unit_verifies_with_the_unpacked_binary() {
    let Some((dir, top)) = unpacked() else {
        return;
    };
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip("no systemd-analyze");
        return;
    }
    let unit = std::fs::read_to_string(top.join("examples/deploy/systemd/memtrace-agent.service"))
        .expect("read unit");
    assert!(unit.contains("ExecStart=/usr/local/bin/memtrace agent "));
    let unit = unit.replace(
        "/usr/local/bin/memtrace",
        &top.join("memtrace").display().to_string(),
    );
    let path = dir.path().join("memtrace-agent.service");
    std::fs::write(&path, unit).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("memtrace-agent.service"),
        "systemd-analyze complained about the unit: {stderr}"
    );
    // The command line the unit runs parses.
    let help = Command::new(top.join("memtrace"))
        .args([
            "agent",
            "--metrics",
            "127.0.0.1:9464",
            "--interval",
            "15s",
            "--help",
        ])
        .output()
        .expect("memtrace agent --help");
    assert!(help.status.success());
}

#[test]
fn the_scrape_config_loads_in_prometheus_3() {
    let Some((dir, top)) = unpacked() else {
        return;
    };
    let prometheus = workspace().join("target/prometheus/tree/usr/bin/prometheus");
    if !prometheus.exists() {
        common::skip("no Prometheus (cargo xtask test installs it)");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut server = Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            top.join("examples/deploy/prometheus/prometheus.yml")
                .display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut jobs = String::new();
    while Instant::now() < deadline {
        if let Ok(out) = Command::new("curl")
            .args([
                "-sf",
                &format!("http://127.0.0.1:{port}/api/v1/status/config"),
            ])
            .output()
        {
            if out.status.success() {
                jobs = String::from_utf8_lossy(&out.stdout).into_owned();
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        jobs.contains("job_name: memtrace\\n"),
        "config not loaded: {jobs}"
    );
    assert!(jobs.contains("job_name: memtrace-kubernetes"), "{jobs}");
}

#[test]
fn the_dashboard_queries_only_metrics_the_agent_serves() {
    let Some((_dir, top)) = unpacked() else {
        return;
    };
    let text = std::fs::read_to_string(top.join("examples/deploy/grafana/memtrace-dashboard.json"))
        .expect("read dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let page = memtrace::sinks::prometheus::render(&memtrace::sinks::Window::default(), 10);
    let served: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 4, "{} panels", panels.len());
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("memtrace_"))
                .collect();
            assert!(!names.is_empty(), "{expr}");
            for name in names {
                assert!(
                    served.contains(&name),
                    "{name} (in {expr}) is not served: {served:?}"
                );
            }
        }
    }
}
