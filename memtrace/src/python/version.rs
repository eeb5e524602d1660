//! What a CPython binary's file name and read-only data say about it, for
//! `probe`: the version of interpreters older than 3.11, which have no
//! `Py_Version` symbol (python-stacks.md §7: "otherwise a file-name regex,
//! then a string scan"), and the free-threaded ABI flag `t` (PEP 703:
//! `libpython3.13t.so`, `python3.13t`).

use std::path::Path;

use super::types::PythonVersion;

/// What a CPython file name says: `python3.10` or `libpython3.13t.so.1.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameVersion {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// The ABI flags after the version hold `t`: a free-threaded
    /// (`Py_GIL_DISABLED`) build.
    pub free_threaded: bool,
}

/// Parses the `pythonM.N[abiflags]` part of `path`'s file name; `None` when
/// it has none (`python3`, `uwsgi`).
#[must_use]
pub fn from_file_name(path: &Path) -> Option<NameVersion> {
    let name = path.file_name()?.to_str()?;
    let rest = &name[name.find("python")? + "python".len()..];
    let (major, rest) = leading_number(rest)?;
    let rest = rest.strip_prefix('.')?;
    let (minor, rest) = leading_number(rest)?;
    // ABI flags (PEP 3149): letters up to the first '.' or '-'.
    let flags = rest.split(['.', '-']).next().unwrap_or("");
    if !flags.chars().all(|c| c.is_ascii_lowercase()) {
        return None;
    }
    Some(NameVersion {
        major,
        minor,
        free_threaded: flags.contains('t'),
    })
}

/// The decimal number at the start of `text` (at most 3 digits) and what
/// follows it.
fn leading_number(text: &str) -> Option<(u8, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 3 {
        return None;
    }
    Some((text[..digits].parse().ok()?, &text[digits..]))
}

/// The micro version of `major.minor` found in a binary's `.rodata`: the
/// most frequent `M.N.X` that ends a NUL-terminated string and is not part of
/// a longer number. `PY_VERSION` ("3.10.13") is such a string, though the
/// linker may merge it into the tail of another one (the build directory's
/// `Python-3.10.13`), which still ends the same way. `None` when absent.
#[must_use]
pub fn micro_from_rodata(rodata: &[u8], major: u8, minor: u8) -> Option<u8> {
    let needle = format!("{major}.{minor}.");
    let needle = needle.as_bytes();
    let mut counts = [0u32; 256];
    for start in memchr_all(rodata, needle) {
        let before = start.checked_sub(1).map(|i| rodata[i]);
        if before.is_some_and(|b| b.is_ascii_digit() || b == b'.') {
            continue;
        }
        let tail = &rodata[start + needle.len()..];
        let digits = tail.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || tail.get(digits) != Some(&0) {
            continue;
        }
        let micro = std::str::from_utf8(&tail[..digits]).ok()?.parse::<u8>();
        if let Ok(micro) = micro {
            counts[usize::from(micro)] += 1;
        }
    }
    let (micro, &count) = counts.iter().enumerate().max_by_key(|&(_, c)| *c)?;
    (count > 0).then(|| u8::try_from(micro).unwrap_or(0))
}

/// Start offsets of every occurrence of `needle` in `haystack`.
fn memchr_all<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(move |(_, window)| *window == needle)
        .map(|(start, _)| start)
}

/// The version of a binary without `Py_Version`: major and minor from its
/// file name, micro from its `.rodata` (0 when not found).
#[must_use]
pub fn from_binary(path: &Path, rodata: &[u8]) -> Option<PythonVersion> {
    let name = from_file_name(path)?;
    let micro = micro_from_rodata(rodata, name.major, name.minor).unwrap_or(0);
    Some(PythonVersion {
        major: name.major,
        minor: name.minor,
        micro,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Option<NameVersion> {
        from_file_name(Path::new(text))
    }

    #[test]
    fn file_names() {
        let plain = NameVersion {
            major: 3,
            minor: 10,
            free_threaded: false,
        };
        assert_eq!(name("/x/lib/libpython3.10.so.1.0"), Some(plain));
        assert_eq!(name("/x/bin/python3.10"), Some(plain));
        assert_eq!(name("libpython3.10d.so"), Some(plain));
        let threaded = name("/x/lib/libpython3.13t.so.1.0").unwrap();
        assert!(threaded.free_threaded);
        assert_eq!((threaded.major, threaded.minor), (3, 13));
        assert!(name("/usr/bin/python3.13t").unwrap().free_threaded);
        assert!(name("libpython3.13td.so").unwrap().free_threaded);
        assert_eq!(name("/usr/bin/python3"), None);
        assert_eq!(name("/usr/bin/uwsgi"), None);
        assert_eq!(name("python3.x"), None);
        assert_eq!(name("python3.10_1"), None);
    }

    #[test]
    fn micro_is_read_from_string_tails() {
        let rodata = b"\0/tmp/Python-3.10.13\0/root/.pyenv/versions/3.10.13\0x13.10.99\0";
        assert_eq!(micro_from_rodata(rodata, 3, 10), Some(13));
        assert_eq!(micro_from_rodata(b"3.10.7\0", 3, 10), Some(7));
        // Not NUL-terminated, another minor, or a longer number: ignored.
        assert_eq!(micro_from_rodata(b"3.10.7 (main)\0", 3, 10), None);
        assert_eq!(micro_from_rodata(b"\x003.9.18\0", 3, 10), None);
        assert_eq!(micro_from_rodata(b"\x0013.10.4\0", 3, 10), None);
    }

    #[test]
    fn pyenv_binaries() {
        for (version, lib) in [("3.9.18", "3.9"), ("3.10.13", "3.10")] {
            let home = std::env::var("HOME").unwrap_or_default();
            let path = format!("{home}/.pyenv/versions/{version}/lib/libpython{lib}.so.1.0");
            let Ok(data) = std::fs::read(&path) else {
                println!("skipping: {path} is not installed");
                continue;
            };
            let elf = object::File::parse(&*data).unwrap();
            let rodata = object::Object::section_by_name(&elf, ".rodata").unwrap();
            let rodata = object::ObjectSection::data(&rodata).unwrap();
            let found = from_binary(Path::new(&path), rodata).unwrap();
            assert_eq!(found.to_string(), version);
        }
    }
}
