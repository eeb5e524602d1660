//! Kernel side, userspace half: where the functions that the uprobes
//! (finalization, allocator mode) probe are in a traced binary. A name is
//! looked up in the binary's `.dynsym`, then its `.symtab`, then the
//! separate debug file its build-id names (`<dir>/.build-id/xx/rest.debug`
//! under `--debug-dir` and `/usr/lib/debug`: Debian's and Ubuntu's
//! `-dbg`/`-dbgsym` packages); the probe's file offset comes from the
//! binary's `PT_LOAD` program headers, not from its sections (patchelf moves
//! every segment's file offset by a page while its vaddr stays). Each image
//! is read once, its debug file too.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object as _, ObjectSegment as _};

/// Where Debian and Ubuntu install separate debug files by build-id.
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// The symbol table a function was found in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SymbolTable {
    /// The binary's `.dynsym` (exported).
    Dynsym,
    /// The binary's own `.symtab`.
    Symtab,
    /// The `.symtab` of the separate debug file at this path.
    DebugFile(PathBuf),
}

impl fmt::Display for SymbolTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dynsym => f.write_str(".dynsym"),
            Self::Symtab => f.write_str(".symtab"),
            Self::DebugFile(path) => write!(f, "debug file `{}`", path.display()),
        }
    }
}

/// A function of an image, where a uprobe on its first instruction goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its link-time virtual address (`st_value`).
    pub vaddr: u64,
    /// Offset in the image's file of its first byte (from the `PT_LOAD`
    /// that maps `vaddr`): what a uprobe is attached at.
    pub file_offset: u64,
    /// The table that named it.
    pub table: SymbolTable,
}

/// The functions of one ELF image, by name (the first table that names
/// one wins: `.dynsym`, `.symtab`, the debug file).
#[derive(Debug)]
pub struct Image {
    path: PathBuf,
    functions: HashMap<String, Function>,
    /// Whether a debug file was found and read.
    debug_file: Option<PathBuf>,
}

impl Image {
    /// Reads `path`'s symbols, and those of its debug file when `path` has
    /// no `.symtab`, looked for under each of `debug_dirs` in order.
    ///
    /// # Errors
    /// `path` cannot be read or is not ELF.
    pub fn read(path: &Path, debug_dirs: &[PathBuf]) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let file = File::open(path).with_context(|| format!("cannot open `{}`", path.display()))?;
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache)
            .with_context(|| format!("cannot parse `{}` as ELF", path.display()))?;
        let loads = load_segments(&elf);
        let mut functions = HashMap::new();
        add_functions(
            &mut functions,
            elf.dynamic_symbols(),
            &loads,
            &SymbolTable::Dynsym,
        );
        add_functions(&mut functions, elf.symbols(), &loads, &SymbolTable::Symtab);
        let mut debug_file = None;
        if elf.symbol_table().is_none() {
            let build_id = elf.build_id().ok().flatten().map(<[u8]>::to_vec);
            if let Some(found) = build_id.and_then(|id| find_debug_file(&id, debug_dirs)) {
                let table = SymbolTable::DebugFile(found.path.clone());
                let debug = object::File::parse(&found.cache)
                    .with_context(|| format!("cannot parse `{}`", found.path.display()))?;
                add_functions(&mut functions, debug.symbols(), &loads, &table);
                debug_file = Some(found.path);
            }
        }
        Ok(Self {
            path: path.to_owned(),
            functions,
            debug_file,
        })
    }

    /// The function `name`, if a table names it.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.get(name)
    }

    /// The debug file that was read, if one was found.
    pub fn debug_file(&self) -> Option<&Path> {
        self.debug_file.as_deref()
    }

    /// Up to `len` bytes of `function`'s code, read from the image's file
    /// (fewer at the end of the file; none when it cannot be read).
    pub fn code(&self, function: &Function, len: usize) -> Vec<u8> {
        let mut code = vec![0; len];
        let read = File::open(&self.path)
            .and_then(|file| file.read_at(&mut code, function.file_offset))
            .unwrap_or(0);
        code.truncate(read);
        code
    }
}

/// A `PT_LOAD` program header: (p_vaddr, p_filesz, p_offset).
type Load = (u64, u64, u64);

/// The image's loadable segments.
fn load_segments<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>) -> Vec<Load> {
    elf.segments()
        .filter_map(|segment| {
            let (offset, filesz) = segment.file_range();
            (filesz > 0).then(|| (segment.address(), filesz, offset))
        })
        .collect()
}

/// The file offset that `vaddr` is loaded from, if a segment maps it from
/// the file.
fn file_offset(loads: &[Load], vaddr: u64) -> Option<u64> {
    loads
        .iter()
        .find(|(start, filesz, _)| (*start..start + filesz).contains(&vaddr))
        .map(|(start, _, offset)| vaddr - start + offset)
}

/// Adds the defined functions of `symbols` not named yet, placed with
/// `loads`.
fn add_functions<'data, 'file, S>(
    functions: &mut HashMap<String, Function>,
    symbols: impl Iterator<Item = S>,
    loads: &[Load],
    table: &SymbolTable,
) where
    S: object::ObjectSymbol<'data>,
{
    for symbol in symbols {
        if symbol.is_undefined() || symbol.kind() != object::SymbolKind::Text {
            continue;
        }
        let (Ok(name), Some(file_offset)) = (symbol.name(), file_offset(loads, symbol.address()))
        else {
            continue;
        };
        functions
            .entry(name.to_owned())
            .or_insert_with(|| Function {
                vaddr: symbol.address(),
                file_offset,
                table: table.clone(),
            });
    }
}

/// A debug file found by build-id, open for reading.
struct DebugFile {
    path: PathBuf,
    cache: object::ReadCache<File>,
}

/// The first `<dir>/.build-id/xx/rest.debug` of `debug_dirs` whose own
/// build-id is `build_id`.
fn find_debug_file(build_id: &[u8], debug_dirs: &[PathBuf]) -> Option<DebugFile> {
    let hex: String = build_id.iter().map(|byte| format!("{byte:02x}")).collect();
    if hex.len() < 3 {
        return None;
    }
    let relative = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    debug_dirs.iter().find_map(|dir| {
        let path = dir.join(&relative);
        let cache = object::ReadCache::new(File::open(&path).ok()?);
        let matches = object::File::parse(&cache)
            .ok()?
            .build_id()
            .ok()
            .flatten()
            .is_some_and(|id| id == build_id);
        matches.then_some(DebugFile { path, cache })
    })
}

/// What tells one file from another however it is reached (its own path,
/// `/proc/PID/map_files/...` of each process that maps it): its device and
/// inode, else (when it cannot be read) its path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum FileIdentity {
    Inode { dev: u64, ino: u64 },
    Path(PathBuf),
}

/// The [`FileIdentity`] of `path`.
pub(super) fn file_identity(path: &Path) -> FileIdentity {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map_or_else(
        |_| FileIdentity::Path(path.to_owned()),
        |m| FileIdentity::Inode {
            dev: m.dev(),
            ino: m.ino(),
        },
    )
}

/// The images read so far, by file, each read once.
pub struct ElfSymbols {
    debug_dirs: Vec<PathBuf>,
    images: HashMap<FileIdentity, Arc<Image>>,
}

impl ElfSymbols {
    /// Looks for debug files under each of `extra_debug_dirs` (`--debug-dir`),
    /// then under [`SYSTEM_DEBUG_DIR`].
    pub fn new(extra_debug_dirs: &[PathBuf]) -> Self {
        let mut debug_dirs = extra_debug_dirs.to_vec();
        debug_dirs.push(SYSTEM_DEBUG_DIR.into());
        Self {
            debug_dirs,
            images: HashMap::new(),
        }
    }

    /// The image at `path`, read on first use of its file.
    ///
    /// # Errors
    /// See [`Image::read`].
    pub fn image(&mut self, path: &Path) -> anyhow::Result<Arc<Image>> {
        let key = file_identity(path);
        if let Some(image) = self.images.get(&key) {
            return Ok(Arc::clone(image));
        }
        let image = Arc::new(Image::read(path, &self.debug_dirs)?);
        self.images.insert(key, Arc::clone(&image));
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vaddr_is_placed_by_its_segment_not_by_a_fixed_base() {
        // patchelf'd: the text segment's file offset moved by a page.
        let loads = [(0x40_0000, 0x1000, 0x1000), (0x40_1000, 0x8000, 0x2000)];
        assert_eq!(file_offset(&loads, 0x40_1234), Some(0x2234));
        assert_eq!(file_offset(&loads, 0x40_0010), Some(0x1010));
        assert_eq!(file_offset(&loads, 0x50_0000), None);
    }

    #[test]
    fn the_test_binary_finds_its_own_functions_at_their_code() {
        let exe = std::env::current_exe().unwrap();
        let image = Image::read(&exe, &[]).unwrap();
        // Rust test binaries keep a .symtab; `main` is defined there.
        let main = image.function("main").expect("main in .symtab");
        assert_eq!(main.table, SymbolTable::Symtab);
        assert_eq!(image.code(main, 4).len(), 4);
    }

    /// Debian's 3.14 (static, no `.symtab`, patchelf'd) with its `-dbg`
    /// debug file, as `cargo xtask test` unpacks them under
    /// target/interpreters.
    #[test]
    fn a_stripped_patchelfd_interpreter_is_read_with_its_debug_file() {
        let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/interpreters/python3.14");
        let python = tree.join("usr/bin/python3.14");
        if !python.exists() {
            eprintln!(
                "skipping: {} not installed (cargo xtask test installs it)",
                python.display()
            );
            return;
        }
        let without = Image::read(&python, &[]).unwrap();
        assert!(without.function("_PyThreadState_RemoveExcept").is_none());
        let image = Image::read(&python, &[tree.join("usr/lib/debug")]).unwrap();
        assert!(image.debug_file().is_some());
        let finalize = image.function("Py_FinalizeEx").unwrap();
        assert_eq!(finalize.table, SymbolTable::Dynsym);
        // patchelf moved the text segment's file offset a page past
        // `vaddr - 0x400000`; Py_FinalizeEx starts with endbr64.
        assert_ne!(finalize.file_offset, finalize.vaddr - 0x40_0000);
        assert_eq!(image.code(finalize, 4), [0xf3, 0x0f, 0x1e, 0xfa]);
        let teardown = image.function("_PyThreadState_RemoveExcept").unwrap();
        assert!(matches!(teardown.table, SymbolTable::DebugFile(_)));
        assert_eq!(image.code(teardown, 4), [0xf3, 0x0f, 0x1e, 0xfa]);
    }

    #[test]
    fn libc_exports_malloc_in_dynsym() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .find(|path| path.contains("libc.so"))
            .expect("libc mapped");
        let image = Image::read(Path::new(libc), &[]).unwrap();
        assert_eq!(image.function("malloc").unwrap().table, SymbolTable::Dynsym);
    }
}
