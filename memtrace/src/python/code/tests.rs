//! Tests of the frame resolver against live interpreters and synthetic
//! caches.

use super::*;
use crate::python::probe::tests::spawn;
use crate::python::probe::{probe, Probe};

/// Prints, for three code objects (ASCII, Latin-1 and UCS-2 names; a
/// UCS-4 file name), their address, first line, names and one
/// (instruction index, line) pair from `co_positions()`. With `FORK`
/// set it forks first and the child prints instead, adding a child-only
/// code object.
const SCRIPT: &str = r#"
import json, os, sys, time
src = '''
def café(x):
    y = x + 1
    return y

class Klass:
    def 函数(self):
        z = 2
        return z
'''
ns = {}
exec(compile(src, "файл😀.py", "exec"), ns)
def plain():
    a = 1
    b = a + 1
    return b
def describe(c):
    pos = [p[0] for p in c.co_positions()]
    idx = max(i for i, l in enumerate(pos) if l is not None)
    import ctypes
    return {"addr": id(c), "first": c.co_firstlineno, "qualname": c.co_qualname, "name": id(c.co_qualname),
            "shape": ctypes.c_uint64.from_address(id(c) + 16).value,
            "file": c.co_filename, "index": idx, "line": pos[idx]}
codes = [plain.__code__, ns["café"].__code__, ns["Klass"].__dict__["函数"].__code__]
if FORK and os.fork() == 0:
    def child_only():
        return 3
    codes.append(child_only.__code__)
    print(json.dumps({"pid": os.getpid(), "codes": [describe(c) for c in codes]}), flush=True)
    time.sleep(60)
elif not FORK:
    print(json.dumps({"pid": os.getpid(), "codes": [describe(c) for c in codes]}), flush=True)
time.sleep(60)
"#;

#[derive(serde::Deserialize)]
struct Described {
    addr: u64,
    first: u32,
    qualname: String,
    name: u64,
    shape: u64,
    file: String,
    index: i32,
    line: u32,
}

#[derive(serde::Deserialize)]
struct Output {
    pid: u32,
    codes: Vec<Described>,
}

fn frame(code: &Described, instr_index: i32) -> PyFrame {
    PyFrame {
        code_addr: code.addr,
        instr_index,
        fingerprint: code_fingerprint(code.first, code.name, code.shape),
    }
}

fn resolve_in(exe: &str) {
    let Some(interp) = spawn(exe, &format!("FORK = False\n{SCRIPT}")) else {
        return;
    };
    let output: Output = serde_json::from_str(&interp.first_line).unwrap();
    let Probe::Python(python) = probe(output.pid).unwrap() else {
        panic!("{exe} not detected");
    };
    let mut resolver = FrameResolver::new();
    resolver.register(output.pid, &python);
    for code in &output.codes {
        let at_start = resolver.resolve(output.pid, &frame(code, -1)).unwrap();
        assert_eq!(
            at_start,
            PyLocation {
                function: code.qualname.clone(),
                file: code.file.clone(),
                line: code.first,
            }
        );
        let running = resolver
            .resolve(output.pid, &frame(code, code.index))
            .unwrap();
        assert_eq!(running.line, code.line, "{}", code.qualname);
        assert_ne!(code.line, code.first, "{}", code.qualname);
        let stale = PyFrame {
            fingerprint: code_fingerprint(code.first + 1, code.name, code.shape),
            ..frame(code, 0)
        };
        assert!(matches!(
            resolver.resolve(output.pid, &stale),
            Err(ResolveError::FingerprintMismatch { .. })
        ));
    }
    let names: Vec<_> = output.codes.iter().map(|c| c.qualname.as_str()).collect();
    assert_eq!(names, ["plain", "café", "Klass.函数"]);
    assert_eq!(output.codes[1].file, "файл😀.py");
    resolver.forget(output.pid);
    assert!(matches!(
        resolver.resolve(output.pid, &frame(&output.codes[0], -1)),
        Err(ResolveError::UnknownProcess { .. })
    ));
}

#[test]
fn resolves_3_11_shared() {
    resolve_in("~/.pyenv/versions/3.11.7/bin/python3.11");
}

#[test]
fn resolves_3_11_debian_static() {
    resolve_in("/usr/bin/python3.11");
}

#[test]
fn resolves_3_12_shared() {
    resolve_in("~/.pyenv/versions/3.12.1/bin/python3.12");
}

#[test]
fn resolves_3_13_shared() {
    resolve_in("~/.pyenv/versions/3.13.0/bin/python3.13");
}

/// A forked child resolves from its own memory, and from its parent's
/// once it has exited.
#[test]
fn exited_child_falls_back_to_parent() {
    let script = format!("FORK = True\n{SCRIPT}");
    let Some(interp) = spawn("~/.pyenv/versions/3.12.1/bin/python3.12", &script) else {
        return;
    };
    let parent = interp.child.id();
    let output: Output = serde_json::from_str(&interp.first_line).unwrap();
    let child = output.pid;
    assert_ne!(child, parent);
    let Probe::Python(python) = probe(parent).unwrap() else {
        panic!("parent not detected");
    };
    let mut resolver = FrameResolver::new();
    resolver.register(parent, &python);
    assert!(resolver.inherit(child, parent));
    assert!(!resolver.inherit(child + 1_000_000, 1));
    let child_only = &output.codes[3];
    assert_eq!(
        resolver
            .resolve(child, &frame(child_only, -1))
            .unwrap()
            .function,
        "child_only"
    );
    let child_pid = nix::unistd::Pid::from_raw(i32::try_from(child).unwrap());
    nix::sys::signal::kill(child_pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    // The parent never reaps it: wait until it is a zombie (its memory is gone).
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        if stat.contains(") Z ") || stat.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let inherited = &output.codes[0];
    let location = resolver
        .resolve(child, &frame(inherited, inherited.index))
        .unwrap();
    assert_eq!(
        (location.function.as_str(), location.line),
        ("plain", inherited.line)
    );
    resolver.forget(parent);
    assert!(matches!(
        resolver.resolve(child, &frame(&output.codes[1], -1)),
        Err(ResolveError::Memory { .. })
    ));
}

/// A registered process with no open memory and `codes` cached.
fn unreadable(parent: Option<u32>, codes: HashMap<u64, CodeObject>) -> Registered {
    Registered {
        layout: *crate::python::offsets::layout(3, 12).unwrap(),
        memory: None,
        parent,
        codes,
    }
}

/// A forked child takes a code object from its parent's cache when the
/// fingerprint matches, without reading memory (none is open here), and
/// caches it itself; a mismatching cached object is not taken.
/// Address of the name str of the cached code objects below.
const NAME: u64 = 0x7f00_1234_5678;
/// Their shape word (`ob_size`: code units).
const SHAPE: u64 = 40;

#[test]
fn child_uses_the_parent_cache_when_the_fingerprint_matches() {
    let code = CodeObject {
        first_lineno: 10,
        fingerprint: code_fingerprint(10, NAME, SHAPE),
        function: "Cache.put".to_owned(),
        file: "cache.py".to_owned(),
        // code 13, 1 unit, line +2 (svarint 4).
        linetable: vec![0xe8, 4],
        format: LineFormat::Locations,
        lines: HashMap::new(),
    };
    let mut resolver = FrameResolver::new();
    let parent_codes = HashMap::from([(0x1000, code)]);
    resolver.processes.insert(1, unreadable(None, parent_codes));
    resolver
        .processes
        .insert(2, unreadable(Some(1), HashMap::new()));
    resolver
        .processes
        .insert(3, unreadable(Some(2), HashMap::new()));
    let frame = PyFrame {
        code_addr: 0x1000,
        instr_index: 0,
        fingerprint: code_fingerprint(10, NAME, SHAPE),
    };
    let expected = PyLocation {
        function: "Cache.put".to_owned(),
        file: "cache.py".to_owned(),
        line: 12,
    };
    assert_eq!(resolver.resolve(3, &frame).unwrap(), expected);
    assert!(resolver.processes[&3].codes.contains_key(&0x1000));
    assert!(!resolver.processes[&2].codes.contains_key(&0x1000));
    let stale = PyFrame {
        fingerprint: code_fingerprint(11, NAME, SHAPE),
        ..frame
    };
    assert!(matches!(
        resolver.resolve(2, &stale),
        Err(ResolveError::NoMemory { tgid: 2 })
    ));
    assert!(matches!(
        resolver.resolve(9, &frame),
        Err(ResolveError::UnknownProcess { tgid: 9 })
    ));
    // A failed resolve leaves the process registered.
    assert_eq!(resolver.resolve(2, &frame).unwrap(), expected);
}

/// An exec'd module's `<module>` and its class body both start at line
/// 1: once one is freed and the other's next copy takes its address, the
/// cached one must not be taken for it (it was, with the line alone as
/// fingerprint: `<module>` instead of `GeneratedTable`).
#[test]
fn same_first_line_other_name_is_not_a_cache_hit() {
    let module = CodeObject {
        first_lineno: 1,
        fingerprint: code_fingerprint(1, NAME, SHAPE),
        function: "<module>".to_owned(),
        file: display_file(String::new()),
        linetable: vec![0xe8, 4],
        format: LineFormat::Locations,
        lines: HashMap::new(),
    };
    let mut resolver = FrameResolver::new();
    let codes = HashMap::from([(0x1000, module)]);
    resolver.processes.insert(1, unreadable(None, codes));
    let class_body = PyFrame {
        code_addr: 0x1000,
        instr_index: 0,
        fingerprint: code_fingerprint(1, NAME + 0x40, SHAPE),
    };
    assert!(matches!(
        resolver.resolve(1, &class_body),
        Err(ResolveError::NoMemory { tgid: 1 })
    ));
    let module_frame = PyFrame {
        fingerprint: code_fingerprint(1, NAME, SHAPE),
        ..class_body
    };
    let location = resolver.resolve(1, &module_frame).unwrap();
    assert_eq!(
        (
            location.function.as_str(),
            location.file.as_str(),
            location.line
        ),
        ("<module>", "<string>", 3)
    );
}

#[test]
fn fingerprints_differ_by_line_name_and_shape() {
    let base = code_fingerprint(1, NAME, SHAPE);
    assert_ne!(base, code_fingerprint(2, NAME, SHAPE));
    // One static `<module>` name, another length of code.
    assert_ne!(base, code_fingerprint(1, NAME, SHAPE + 1));
    let mut seen = std::collections::HashSet::new();
    for step in 0..4096 {
        seen.insert(code_fingerprint(1, NAME + 8 * step, SHAPE));
        seen.insert(code_fingerprint(step.try_into().unwrap(), NAME, SHAPE + 1));
    }
    assert_eq!(seen.len(), 8192);
}

#[test]
fn empty_file_names_show_as_string() {
    assert_eq!(display_file(String::new()), "<string>");
    assert_eq!(display_file("app.py".to_owned()), "app.py");
    assert_eq!(display_file("<string>".to_owned()), "<string>");
}

#[test]
fn decodes_each_kind() {
    assert_eq!(decode_code_points(b"caf\xe9", 1), "café");
    assert_eq!(decode_code_points(&[0xfd, 0x51, 0x70, 0x65], 2), "函数");
    assert_eq!(decode_code_points(&[0x00, 0xf6, 0x01, 0x00], 4), "😀");
    assert_eq!(decode_code_points(&[0x00, 0xd8], 2), "\u{fffd}");
    assert_eq!(decode_code_points(&[0xff, 0xff, 0xff, 0xff], 4), "\u{fffd}");
}
