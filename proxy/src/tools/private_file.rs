//! Files only their owner may read (0600): secrets, tokens and the agents file.

use std::fs::{OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MODE: u32 = 0o600;

/// Writes `contents` to `path` (created or truncated), owner-only.
pub fn write(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(MODE).open(path)?;
    // An existing file keeps its mode on open: tighten it before anything is written.
    f.set_permissions(Permissions::from_mode(MODE))?;
    f.write_all(contents)?;
    f.sync_all()
}

/// Like [`write`], through a temporary file renamed over `path`, so a reader never sees half a
/// file.
pub fn replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let tmp: PathBuf = path.with_file_name(name);
    write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Creates `path` with `contents`, owner-only; `Ok(false)` (and nothing written) if it exists.
pub fn create_new(path: &Path, contents: &[u8]) -> io::Result<bool> {
    match OpenOptions::new().write(true).create_new(true).mode(MODE).open(path) {
        Ok(mut f) => {
            f.write_all(contents)?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_are_owner_only_even_when_they_existed_with_a_looser_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        write(&path, b"new").unwrap();
        assert_eq!((std::fs::read_to_string(&path).unwrap(), mode(&path)), ("new".into(), 0o600));

        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        replace(&path, b"newer").unwrap();
        assert_eq!((std::fs::read_to_string(&path).unwrap(), mode(&path)), ("newer".into(), 0o600));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");

        let fresh = dir.path().join("fresh");
        assert!(create_new(&fresh, b"a").unwrap());
        assert!(!create_new(&fresh, b"b").unwrap());
        assert_eq!((std::fs::read_to_string(&fresh).unwrap(), mode(&fresh)), ("a".into(), 0o600));
    }
}
