//! Who a traced process is, for `memtrace agent`: its service name (its
//! `OTEL_SERVICE_NAME`, else its gunicorn/celery/uwsgi process title, else
//! its script's name), its cgroup path and, on Kubernetes, the pod UID and
//! container id in that path. Read once per process from `/proc/PID/environ`,
//! `/proc/PID/cmdline` and `/proc/PID/cgroup`; the role comes from the
//! report's process kinds at each window.

use std::path::Path;

use procfs::process::Process;

/// What `/proc` says about one process, read when it enters the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Its service name (see [`service_name`]).
    pub service_name: String,
    /// Its cgroup v2 path (`0::PATH` in `/proc/PID/cgroup`), `/` when it
    /// cannot be read.
    pub cgroup: String,
    /// The pod UID in the cgroup path, on Kubernetes.
    pub pod_uid: Option<String>,
    /// The container id in the cgroup path, under a container engine.
    pub container_id: Option<String>,
}

impl Identity {
    /// Reads process `pid`'s identity; fields that cannot be read (a
    /// process that exited, or of another user without the capabilities)
    /// fall back as each one's doc says.
    pub fn read(pid: u32) -> Self {
        let process = Process::new(pid as i32).ok();
        let argv = process
            .as_ref()
            .and_then(|p| p.cmdline().ok())
            .unwrap_or_default();
        let comm = process
            .as_ref()
            .and_then(|p| p.stat().ok())
            .map(|s| s.comm)
            .unwrap_or_default();
        let otel = process.as_ref().and_then(otel_service_name);
        let cgroup = process
            .as_ref()
            .and_then(unified_cgroup)
            .unwrap_or_else(|| "/".to_owned());
        let (pod_uid, container_id) = kubernetes_ids(&cgroup);
        Self {
            service_name: service_name(otel.as_deref(), &argv, &comm),
            cgroup,
            pod_uid,
            container_id,
        }
    }

    /// The identity of a process that already exited, from the command
    /// line the trace recorded (`cmdline`, arguments joined with spaces):
    /// its service name without `OTEL_SERVICE_NAME`, cgroup `/`.
    pub fn from_cmdline(cmdline: &str) -> Self {
        let argv: Vec<String> = cmdline.split_whitespace().map(str::to_owned).collect();
        let comm = argv
            .first()
            .map_or("", |program| program.rsplit('/').next().unwrap_or(program));
        Self {
            service_name: service_name(None, &argv, comm),
            cgroup: "/".to_owned(),
            pod_uid: None,
            container_id: None,
        }
    }
}

/// The process's `OTEL_SERVICE_NAME`, when set and not empty.
fn otel_service_name(process: &Process) -> Option<String> {
    let environ = process.environ().ok()?;
    let value = environ.get(std::ffi::OsStr::new("OTEL_SERVICE_NAME"))?;
    let value = value.to_string_lossy().trim().to_owned();
    (!value.is_empty()).then_some(value)
}

/// The cgroup v2 path (the `0::` hierarchy) of `process`.
fn unified_cgroup(process: &Process) -> Option<String> {
    process
        .cgroups()
        .ok()?
        .into_iter()
        .find(|c| c.hierarchy == 0)
        .map(|c| c.pathname)
}

/// The service a process belongs to: `otel` (its `OTEL_SERVICE_NAME`) when
/// given; else the name in a gunicorn title (`gunicorn: worker [NAME]`,
/// setproctitle's form), a celery app (`-A/--app NAME`) or a uwsgi title;
/// else its Python script's file stem (`python3 run_demo.py` is
/// `run_demo`), its `-m` module, or the console script it runs
/// (`/usr/bin/gunicorn app:app` is `gunicorn`); else `comm`.
pub fn service_name(otel: Option<&str>, argv: &[String], comm: &str) -> String {
    if let Some(name) = otel {
        return name.to_owned();
    }
    title_name(argv)
        .or_else(|| celery_app(argv))
        .or_else(|| script_name(argv))
        .unwrap_or_else(|| comm.to_owned())
}

/// The name in a process title a server set over its command line:
/// `gunicorn: master [app:app]` is `app:app`, a title without brackets its
/// program (`gunicorn`, `uWSGI`).
fn title_name(argv: &[String]) -> Option<String> {
    // setproctitle writes the title over argv: one string with spaces, or
    // split at them, depending on the version.
    let title = argv.join(" ");
    let (program, rest) = title.split_once(": ")?;
    if !matches!(program, "gunicorn" | "uWSGI" | "uwsgi" | "celeryd") {
        return None;
    }
    let name = rest
        .split_once('[')
        .and_then(|(_, tail)| tail.split_once(']'))
        .map(|(name, _)| name.trim())
        .filter(|name| !name.is_empty());
    Some(name.unwrap_or(program).to_owned())
}

/// A celery worker's app: `celery -A proj worker` is `proj`.
fn celery_app(argv: &[String]) -> Option<String> {
    let is_celery = argv
        .iter()
        .take(2)
        .any(|a| file_stem(a).is_some_and(|s| s == "celery"));
    if !is_celery {
        return None;
    }
    argv.windows(2)
        .find(|w| w[0] == "-A" || w[0] == "--app")
        .map(|w| w[1].clone())
        .or_else(|| {
            argv.iter()
                .find_map(|a| a.strip_prefix("--app=").map(str::to_owned))
        })
        .or_else(|| Some("celery".to_owned()))
}

/// Options of the Python interpreter that take a value (`-W default`).
const PYTHON_VALUE_OPTIONS: [&str; 3] = ["-W", "-X", "--check-hash-based-pycs"];

/// The program a Python command line runs: the stem of its script, its
/// `-m` module, or, for a command line that is not an interpreter's, the
/// stem of its first word (a console script such as `gunicorn`).
fn script_name(argv: &[String]) -> Option<String> {
    let program = file_stem(argv.first()?)?;
    if !is_python_program(&program) {
        return Some(program);
    }
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-m" => return args.next().cloned(),
            "-c" => return Some(program),
            a if PYTHON_VALUE_OPTIONS.contains(&a) => {
                args.next();
            }
            a if a.starts_with('-') => {}
            script => return file_stem(script),
        }
    }
    Some(program)
}

/// Whether a program's name is a CPython interpreter's (`python`,
/// `python3`, `python3.11`, `python3.13d`).
pub fn is_python_program(program: &str) -> bool {
    program.strip_prefix("python").is_some_and(|version| {
        version
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == 'd' || c == 't')
    })
}

/// A path's file name without its extension, if it has one.
fn file_stem(path: &str) -> Option<String> {
    Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
}

/// The Kubernetes pod UID and container id in a cgroup path, for both
/// cgroup drivers: `cgroupfs`
/// (`/kubepods/burstable/pod<uid>/<container id>`) and `systemd`
/// (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
/// with _ for ->.slice/cri-containerd-<id>.scope`). The container id is the
/// last component's 64 hex digits (engine prefix and `.scope` cut), also
/// outside Kubernetes (`/system.slice/docker-<id>.scope`).
pub fn kubernetes_ids(cgroup: &str) -> (Option<String>, Option<String>) {
    let components: Vec<&str> = cgroup.split('/').filter(|c| !c.is_empty()).collect();
    let pod_uid = components.iter().find_map(|c| pod_uid(c));
    let container_id = components.last().and_then(|c| container_id(c));
    (pod_uid, container_id)
}

/// The pod UID of one cgroup path component (`pod<uid>` or
/// `kubepods-<qos>-pod<uid_with_underscores>.slice`).
fn pod_uid(component: &str) -> Option<String> {
    if !component.starts_with("kubepods") && !component.starts_with("pod") {
        return None;
    }
    let at = component.rfind("pod")?;
    let uid = component[at + 3..]
        .trim_end_matches(".slice")
        .replace('_', "-");
    let is_uid = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    is_uid.then_some(uid)
}

/// The container id of a cgroup path's last component.
fn container_id(component: &str) -> Option<String> {
    let id = component.trim_end_matches(".scope");
    let id = id.rsplit('-').next().unwrap_or(id);
    let is_id = id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit());
    is_id.then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn the_otel_service_name_wins() {
        let name = service_name(Some("checkout"), &argv("gunicorn: master [app:app]"), "py");
        assert_eq!(name, "checkout");
    }

    #[test]
    fn process_titles_name_their_service() {
        assert_eq!(
            service_name(None, &argv("gunicorn: worker [shop:app]"), "x"),
            "shop:app"
        );
        assert_eq!(service_name(None, &argv("uWSGI: master"), "x"), "uWSGI");
        assert_eq!(
            service_name(
                None,
                &argv("/usr/bin/python3 /usr/bin/celery -A proj worker"),
                "x"
            ),
            "proj"
        );
    }

    #[test]
    fn scripts_modules_and_console_scripts_name_their_service() {
        let demo = "/usr/bin/python3 -u examples/prefork_service/run_demo.py --workers 4";
        assert_eq!(service_name(None, &argv(demo), "python3"), "run_demo");
        assert_eq!(
            service_name(None, &argv("python3.11 -X dev -m http.server"), "x"),
            "http.server"
        );
        assert_eq!(
            service_name(None, &argv("/usr/bin/gunicorn app:app"), "x"),
            "gunicorn"
        );
        assert_eq!(service_name(None, &argv("python3 -c pass"), "x"), "python3");
        assert_eq!(service_name(None, &[], "kworker"), "kworker");
    }

    #[test]
    fn kubernetes_ids_come_from_both_cgroup_drivers() {
        let uid = "0f4b2a1e-3c5d-4e6f-8a9b-0c1d2e3f4a5b";
        let id = "a".repeat(64);
        let cgroupfs = format!("/kubepods/burstable/pod{uid}/{id}");
        assert_eq!(
            kubernetes_ids(&cgroupfs),
            (Some(uid.to_owned()), Some(id.clone()))
        );
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{id}.scope",
            uid.replace('-', "_")
        );
        assert_eq!(
            kubernetes_ids(&systemd),
            (Some(uid.to_owned()), Some(id.clone()))
        );
        let docker = format!("/system.slice/docker-{id}.scope");
        assert_eq!(kubernetes_ids(&docker), (None, Some(id)));
        assert_eq!(
            kubernetes_ids("/user.slice/user-0.slice/session-3.scope"),
            (None, None)
        );
    }
}
