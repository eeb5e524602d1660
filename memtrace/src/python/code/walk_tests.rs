//! A userspace replica of the kernel-side walk (python-stacks.md §5) over a
//! sleeping interpreter: checks the BPF offsets (of `offsets::LAYOUTS` or
//! `_Py_DebugOffsets`), the thread-state slot of `probe` and the resolver
//! end to end against what the
//! interpreter itself reports.

use super::*;
use crate::python::probe::tests::{debian_python, spawn};
use crate::python::probe::{probe, Probe};
use memtrace_common::{PyOffsets, NO_OFFSET};

/// Prints its thread state address, the pthread keys whose slot holds
/// it, and its stack (co_name, line), then sleeps on the same line.
const SCRIPT: &str = r#"
import ctypes, json, sys, threading, time, traceback
api = ctypes.pythonapi
api.PyGILState_GetThisThreadState.restype = ctypes.c_void_p
libc = ctypes.CDLL(None)
libc.pthread_getspecific.restype = ctypes.c_void_p
libc.pthread_getspecific.argtypes = [ctypes.c_uint]
def leaf():
    ts = api.PyGILState_GetThisThreadState()
    keys = [k for k in range(32) if libc.pthread_getspecific(k) == ts]
    print(json.dumps({"tstate": ts, "keys": keys, "ident": threading.get_ident(), "stack": [[f.name, f.lineno] for f in traceback.extract_stack()]}), flush=True); time.sleep(60)
def middle():
    leaf()
class Outer:
    def run(self):
        middle()
Outer().run()
"#;

#[derive(serde::Deserialize)]
struct Output {
    tstate: u64,
    keys: Vec<u32>,
    /// `pthread_self()`: the thread pointer (fsbase) on glibc x86-64.
    ident: u64,
    stack: Vec<(String, u32)>,
}

/// The §5 walk, innermost frame first.
fn walk(memory: &ProcessMemory, tstate: u64, offsets: &PyOffsets) -> Vec<PyFrame> {
    let mut frame = if offsets.tstate_cframe == NO_OFFSET {
        memory
            .read_u64(tstate + u64::from(offsets.current_frame))
            .unwrap()
    } else {
        let cframe = memory
            .read_u64(tstate + u64::from(offsets.tstate_cframe))
            .unwrap();
        memory
            .read_u64(cframe + u64::from(offsets.current_frame))
            .unwrap()
    };
    let mut frames = Vec::new();
    while frame != 0 && frames.len() < memtrace_common::MAX_FRAMES {
        let previous = memory
            .read_u64(frame + u64::from(offsets.frame_previous))
            .unwrap();
        if offsets.owner_skip_min != NO_OFFSET {
            let owner = memory
                .read_array::<1>(frame + u64::from(offsets.frame_owner))
                .unwrap()[0];
            if u16::from(owner) >= offsets.owner_skip_min {
                frame = previous;
                continue;
            }
        }
        let code = memory
            .read_u64(frame + u64::from(offsets.frame_code))
            .unwrap();
        let instr = memory
            .read_u64(frame + u64::from(offsets.frame_instr_ptr))
            .unwrap();
        let first = memory
            .read_u32(code + u64::from(offsets.code_firstlineno))
            .unwrap();
        let name = memory
            .read_u64(code + u64::from(offsets.code_name))
            .unwrap();
        let shape = memory
            .read_u64(code + u64::from(offsets.code_shape))
            .unwrap();
        let instr_index = if offsets.code_adaptive == NO_OFFSET {
            // 3.9/3.10: the low half is the `int f_lasti`.
            i32::from_le_bytes(instr.to_le_bytes()[..4].try_into().unwrap())
        } else {
            let delta = i64::try_from(instr).unwrap()
                - i64::try_from(code + u64::from(offsets.code_adaptive)).unwrap();
            i32::try_from(delta / 2).unwrap()
        };
        frames.push(PyFrame {
            code_addr: code,
            instr_index,
            fingerprint: code_fingerprint(first, name, shape),
        });
        frame = previous;
    }
    frames
}

fn walk_in(exe: &str) {
    let Some(interp) = spawn(exe, SCRIPT) else {
        return;
    };
    let output: Output = serde_json::from_str(&interp.first_line).unwrap();
    let tgid = interp.child.id();
    let Probe::Python(python) = probe(tgid).unwrap() else {
        panic!("{exe} not detected");
    };
    assert!(output.keys.len() <= 1, "{exe}: {:?}", output.keys);
    let memory = ProcessMemory::open(tgid).unwrap();
    let slot = output
        .ident
        .wrapping_add(i64::from(python.info.tss_slot_offset) as u64);
    assert_eq!(memory.read_u64(slot).unwrap(), output.tstate, "{exe}");
    let frames = walk(&memory, output.tstate, &python.info.offsets);
    let mut resolver = FrameResolver::new();
    resolver.register(tgid, &python);
    let mut got: Vec<(String, u32)> = frames
        .iter()
        .map(|frame| {
            let location = resolver.resolve(tgid, frame).unwrap();
            let name = location.function.rsplit('.').next().unwrap().to_owned();
            (name, location.line)
        })
        .collect();
    got.reverse();
    assert_eq!(got, output.stack, "{exe}");
}

#[test]
fn walks_3_9_shared() {
    walk_in("~/.pyenv/versions/3.9.18/bin/python3.9");
}

#[test]
fn walks_3_10_shared() {
    walk_in("~/.pyenv/versions/3.10.13/bin/python3.10");
}

#[test]
fn walks_3_11_shared() {
    walk_in("~/.pyenv/versions/3.11.7/bin/python3.11");
}

#[test]
fn walks_3_11_debian_static() {
    walk_in("/usr/bin/python3.11");
}

#[test]
fn walks_3_12_shared() {
    walk_in("~/.pyenv/versions/3.12.1/bin/python3.12");
}

#[test]
fn walks_3_13_shared() {
    walk_in("~/.pyenv/versions/3.13.0/bin/python3.13");
}

#[test]
fn walks_3_14_debian_static() {
    walk_in(&debian_python("3.14"));
}

#[test]
fn walks_3_15_debian_static() {
    walk_in(&debian_python("3.15"));
}
