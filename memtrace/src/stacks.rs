//! Stack assembly, between decoding and symbolizing (`crate::events`,
//! `crate::python`, `crate::symbolize`) and aggregation (`crate::aggregate`):
//! a sampled record's stack, outermost first, made of its Python frames
//! (resolved to code objects), then its native frames (its
//! `NativeStackRecord`, sent right before it, unwound and cut at the
//! interpreter boundary, or the innermost native frame alone when there is
//! no stack), each named with blazesym, with markers saying why frames are
//! missing.

use std::collections::HashMap;

use memtrace_common::{
    NativeStackRecord, PyFrame, RecordHeader, STACK_NO_PYTHON, STACK_NO_THREAD_STATE,
    STACK_READ_ERROR, STACK_SUBINTERPRETER, STACK_TRUNCATED,
};

use crate::{
    aggregate::Frame,
    process::PythonState,
    python::FrameResolver,
    symbolize::{chain::shown_frames, NativeName, NativeSymbolizer, NativeUnwinder, StackCopy},
};

/// Outermost marker of a stack walked in a sub-interpreter
/// (`STACK_SUBINTERPRETER`): the frames below it are that interpreter's;
/// the main-interpreter frames that called into it are not walked.
pub const SUBINTERPRETER_MARKER: &str =
    "in a sub-interpreter; its caller in the main interpreter not shown";

/// The name of a native frame in no mapped file: anonymous (JIT) code, or
/// a process that ended before its record was read, whose maps are gone. Its
/// address would differ in every process (ASLR) and split one path per
/// process, so all of them are one frame, as `perf` names them.
const UNNAMED_NATIVE: &str = "[unknown]";

/// What a sampled record (`MemoryRecord`, `AllocRecord`) says of its stack.
#[derive(Clone, Copy, Debug)]
pub struct RecordStack<'a> {
    /// The process the record is about.
    pub tgid: u32,
    /// How its Python frames were walked (`STACK_*` bits).
    pub stack_status: u32,
    /// Its walked Python frames, innermost first (`frame_count` of them).
    pub frames: &'a [PyFrame],
    /// Its innermost native instruction pointer, 0 when unknown.
    pub native_ip: u64,
    /// The native stack's `ip` is a return address (an allocator's caller),
    /// not a faulting instruction.
    pub ip_is_return: bool,
}

/// The per-process state stacks are assembled with: code objects, symbol
/// tables, unwind tables, and each thread's pending native stack.
#[derive(Default)]
pub struct StackAssembler {
    /// Python frames to code locations, per process (CPython probing
    /// registers a process; a fork's child inherits its parent's).
    pub resolver: FrameResolver,
    symbolizer: NativeSymbolizer,
    unwinder: NativeUnwinder,
    /// Each thread's last `NativeStackRecord`, until the allocation or
    /// memory record sent after it.
    native_stacks: HashMap<u32, Box<NativeStackRecord>>,
}

impl StackAssembler {
    /// Keeps a native stack until the next record of its thread.
    pub fn keep_native_stack(&mut self, record: Box<NativeStackRecord>) {
        self.native_stacks.insert(record.header.tid, record);
    }

    /// The native stack sent with the record of `header` (same thread and
    /// time), if it arrived. Take it first: a stack whose record is ignored
    /// must not stay.
    pub fn take_native_stack(&mut self, header: &RecordHeader) -> Option<Box<NativeStackRecord>> {
        let stack = self.native_stacks.remove(&header.tid)?;
        (stack.header.ts_ns == header.ts_ns && stack.header.tgid == header.tgid).then_some(stack)
    }

    /// Forgets the per-process caches of `tgid` (exit or exec).
    pub fn forget(&mut self, tgid: u32) {
        self.resolver.forget(tgid);
        self.symbolizer.forget(tgid);
        self.unwinder.forget(tgid);
        self.native_stacks.retain(|_, s| s.header.tgid != tgid);
    }

    /// `record`'s stack, outermost first: markers saying why Python frames
    /// are missing (`python`: what CPython probing knows of the process),
    /// the Python frames, then the native frames of `native` (the stack sent
    /// before the record; without it, the frame of `record.native_ip`).
    pub fn assemble(
        &mut self,
        record: &RecordStack<'_>,
        native: Option<&NativeStackRecord>,
        python: Option<&PythonState>,
    ) -> Vec<Frame> {
        let tgid = record.tgid;
        let native = match native {
            Some(copy) => {
                self.native_chain(tgid, copy, !record.frames.is_empty(), record.ip_is_return)
            }
            None => self.native_leaf(tgid, record.native_ip),
        };
        self.stack(tgid, record.stack_status, record.frames, native, python)
    }

    /// The Python `frames` (innermost first, walked with `STACK_*` bits
    /// `status`) outermost first, then the `native` frames (outermost
    /// first); markers say why Python frames are missing.
    fn stack(
        &mut self,
        tgid: u32,
        status: u32,
        frames: &[PyFrame],
        native: Vec<Frame>,
        python: Option<&PythonState>,
    ) -> Vec<Frame> {
        let count = frames.len();
        let mut stack = Vec::with_capacity(count + 3 + native.len());
        if status & STACK_TRUNCATED != 0 {
            stack.push(unknown("outer frames truncated"));
        }
        if status & STACK_SUBINTERPRETER != 0 {
            stack.push(unknown(SUBINTERPRETER_MARKER));
        }
        if status & STACK_NO_PYTHON != 0 {
            stack.push(unknown(no_python_reason(python)));
        } else if status & STACK_NO_THREAD_STATE != 0 {
            stack.push(unknown("no Python thread state: native thread"));
        } else if status & STACK_READ_ERROR != 0 && count == 0 {
            stack.push(unknown("Python frames unreadable"));
        }
        for frame in frames.iter().rev() {
            stack.push(match self.resolver.resolve(tgid, frame) {
                Ok(location) => Frame::from(location),
                Err(_) => unknown("unresolved Python frame"),
            });
        }
        stack.extend(native);
        stack
    }

    /// The frame of instruction `ip` of `tgid` (none for 0).
    fn native_leaf(&mut self, tgid: u32, ip: u64) -> Vec<Frame> {
        if ip == 0 {
            return Vec::new();
        }
        vec![self.native_frame(tgid, ip)]
    }

    /// The native frames of `record`'s stack shown under the record's
    /// Python frames (`has_python`), outermost first: see
    /// [`shown_frames`]. `ip_is_return`: the record's `ip` is a return
    /// address (an allocator's caller), not a faulting instruction. Falls
    /// back to the innermost frame when nothing could be unwound.
    fn native_chain(
        &mut self,
        tgid: u32,
        record: &NativeStackRecord,
        has_python: bool,
        ip_is_return: bool,
    ) -> Vec<Frame> {
        let len = (record.stack_len_bytes as usize).min(record.stack.len());
        let copy = StackCopy {
            ip: record.ip,
            sp: record.sp,
            bp: record.bp,
            stack_start: record.stack_start,
            stack: &record.stack[..len],
            ip_is_return,
        };
        let frames = self.unwinder.unwind(tgid, &copy);
        if frames.is_empty() {
            return self.native_leaf(tgid, record.ip);
        }
        let places: Vec<_> = frames.iter().map(|f| f.place).collect();
        let shown = shown_frames(&places, has_python);
        let ips: Vec<u64> = frames[..shown].iter().rev().map(|f| f.lookup_ip).collect();
        let names = self.symbolizer.symbolize_all(tgid, &ips);
        names.into_iter().map(frame_named).collect()
    }

    /// The frame naming `ip` of `tgid`.
    fn native_frame(&mut self, tgid: u32, ip: u64) -> Frame {
        frame_named(self.symbolizer.symbolize(tgid, ip))
    }
}

/// Why a stack walked with `STACK_NO_PYTHON` has no Python frames, from
/// what CPython probing knows of its process (`python`).
fn no_python_reason(python: Option<&PythonState>) -> String {
    match python {
        Some(PythonState::Known(status)) => status
            .missing_reason()
            .unwrap_or_else(|| "Python stack unavailable".to_owned()),
        _ => "no Python stack yet (interpreter not found or not initialised)".to_owned(),
    }
}

/// The frame named `name`; [`UNNAMED_NATIVE`] when it has none.
fn frame_named(name: Option<NativeName>) -> Frame {
    let NativeName { symbol, module } = name.unwrap_or_else(|| NativeName {
        symbol: UNNAMED_NATIVE.to_owned(),
        module: None,
    });
    Frame::Native { symbol, module }
}

fn unknown(reason: impl Into<String>) -> Frame {
    Frame::Unknown {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_without_a_name_is_unknown_not_its_address() {
        let named = NativeName {
            symbol: "malloc".to_owned(),
            module: Some("libc.so.6".to_owned()),
        };
        assert_eq!(
            frame_named(Some(named)),
            Frame::Native {
                symbol: "malloc".to_owned(),
                module: Some("libc.so.6".to_owned())
            }
        );
        assert_eq!(
            frame_named(None),
            Frame::Native {
                symbol: UNNAMED_NATIVE.to_owned(),
                module: None
            }
        );
    }
}
