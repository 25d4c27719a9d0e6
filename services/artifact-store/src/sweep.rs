//! The start-up sweep: temp files (`.cairn-tmp-*`) left by a crash or kill are removed from the
//! whole data root before the store serves, so a half-written file never outlives a restart;
//! so are the staging directories of restores (`<data_root>/.cairn-tmp-restore-*/`).
//!
//! May depend on: layout (the temp prefix).

use std::path::Path;

use crate::layout::TEMP_PREFIX;

/// Removes every regular file named `.cairn-tmp-*` under `data_root` (symlinks are not
/// followed), and the staging directories of restores that did not finish. Returns how many
/// were removed.
pub fn remove_temp_files(data_root: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(data_root)? {
        let entry = entry?;
        let staging = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX));
        if staging && entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
    }
    for entry in walkdir::WalkDir::new(data_root).follow_links(false) {
        let entry = match entry {
            Ok(entry) => entry,
            // A directory vanishing during the walk is not a failure of the sweep.
            Err(e) if e.io_error().map(|io| io.kind()) == Some(std::io::ErrorKind::NotFound) => {
                continue
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        };
        let is_temp = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX));
        if is_temp && entry.file_type().is_file() {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}
