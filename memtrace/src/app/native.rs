//! The native part of a record's stack, between decoding and aggregation:
//! the unwound native chain of a sampled allocation or fault (its
//! `NativeStackRecord`, sent right before it) cut at the interpreter
//! boundary, or the innermost native frame alone when there is no stack;
//! each frame named with blazesym.

use memtrace_common::{NativeStackRecord, RecordHeader};

use super::session::Session;
use crate::{
    aggregate::Frame,
    symbolize::{chain::shown_frames, NativeName, StackCopy},
};

impl Session {
    /// Keeps a native stack until the next record of its thread.
    pub(super) fn on_native_stack(&mut self, record: Box<NativeStackRecord>) {
        self.native_stacks.insert(record.header.tid, record);
    }

    /// The native stack sent with the record of `header` (same thread and
    /// time), if it arrived.
    pub(super) fn take_native_stack(
        &mut self,
        header: &RecordHeader,
    ) -> Option<Box<NativeStackRecord>> {
        let stack = self.native_stacks.remove(&header.tid)?;
        (stack.header.ts_ns == header.ts_ns && stack.header.tgid == header.tgid).then_some(stack)
    }

    /// The frame of instruction `ip` of `tgid` (none for 0).
    pub(super) fn native_leaf(&mut self, tgid: u32, ip: u64) -> Vec<Frame> {
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
    pub(super) fn native_chain(
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

/// The frame named `name`; [`UNNAMED_NATIVE`] when it has none.
fn frame_named(name: Option<NativeName>) -> Frame {
    let NativeName { symbol, module } = name.unwrap_or_else(|| NativeName {
        symbol: UNNAMED_NATIVE.to_owned(),
        module: None,
    });
    Frame::Native { symbol, module }
}

/// The name of a native frame in no mapped file: anonymous (JIT) code, or
/// a process that ended before its record was read, whose maps are gone. Its
/// address would differ in every process (ASLR) and split one path per
/// process, so all of them are one frame, as `perf` names them.
const UNNAMED_NATIVE: &str = "[unknown]";

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
