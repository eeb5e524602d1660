//! Step 3 of the data flow (symbolize), the merge of the two stacks: which
//! of an unwound native chain (`super::unwind`, innermost first) goes under
//! a record's Python frames. The chain is cut at the interpreter boundary:
//! the native code between the Python line and the allocation is kept
//! (`sqlite3VdbeExec -> ... -> pcache1Alloc`), the interpreter's own frames
//! that called it are not (the Python frames stand for them).

use super::unwind::Place;

/// Most native frames shown for a stack with no Python frames (an embedded
/// host's own code, a native thread) or whose unwinding never reached the
/// interpreter.
pub const MAX_SHOWN_NATIVE_FRAMES: usize = 32;

/// How many of the innermost frames of a chain whose frames are at
/// `places` (innermost first) are shown, when the record has Python frames
/// (`has_python`) or not:
/// - with Python frames, the chain up to (not including) the first frame
///   in the interpreter that comes after frames outside it, or the first
///   frame of the eval loop, whichever is innermost; a chain that is in the
///   interpreter up to its eval loop, or as far as it was unwound, keeps
///   only its innermost frame (as before native stacks were unwound);
/// - without Python frames, or when neither cut is found, at most
///   [`MAX_SHOWN_NATIVE_FRAMES`].
#[must_use]
pub fn shown_frames(places: &[Place], has_python: bool) -> usize {
    let bounded = places.len().min(MAX_SHOWN_NATIVE_FRAMES);
    if !has_python {
        return bounded;
    }
    let mut left_interpreter = false;
    for (index, place) in places.iter().enumerate() {
        match place {
            Place::EvalLoop if !left_interpreter => return 1,
            Place::EvalLoop | Place::Interpreter if left_interpreter => return index,
            Place::Native => left_interpreter = true,
            Place::EvalLoop | Place::Interpreter | Place::CRuntime => {}
        }
    }
    if left_interpreter {
        bounded
    } else {
        bounded.min(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Place::{CRuntime as C, EvalLoop as E, Interpreter as I, Native as N};

    #[test]
    fn native_code_called_from_python_is_kept_up_to_the_interpreter() {
        // pcache1Alloc, sqlite3VdbeExec, ..., _sqlite3 module, then libpython.
        assert_eq!(shown_frames(&[N, N, N, N, I, I, E, I], true), 4);
        // An extension calling back into the C API that allocated.
        assert_eq!(shown_frames(&[I, I, N, N, I, E], true), 4);
    }

    #[test]
    fn the_c_runtime_neither_leaves_nor_enters_the_interpreter() {
        // memcpy into a buffer PyBytes_FromStringAndSize made for an
        // extension: the extension stays.
        assert_eq!(shown_frames(&[C, I, N, I, E], true), 3);
        // memcpy called by the extension itself.
        assert_eq!(shown_frames(&[C, N, I, E], true), 2);
        // memcpy called by the interpreter alone: its innermost frame.
        assert_eq!(shown_frames(&[C, I, I, E], true), 1);
    }

    #[test]
    fn a_chain_inside_the_interpreter_keeps_its_innermost_frame() {
        assert_eq!(shown_frames(&[I, I, I, E, I, I, N, N], true), 1);
        assert_eq!(shown_frames(&[E, I, N], true), 1);
        assert_eq!(shown_frames(&[E], true), 1);
        assert_eq!(shown_frames(&[I, I, I], true), 1);
    }

    #[test]
    fn without_python_frames_the_chain_is_bounded() {
        let long = vec![N; 50];
        assert_eq!(shown_frames(&long, false), MAX_SHOWN_NATIVE_FRAMES);
        assert_eq!(shown_frames(&[N, I, E, I], false), 4);
        assert_eq!(shown_frames(&long, true), MAX_SHOWN_NATIVE_FRAMES);
    }

    #[test]
    fn empty_chains_show_nothing() {
        assert_eq!(shown_frames(&[], true), 0);
        assert_eq!(shown_frames(&[], false), 0);
    }
}
