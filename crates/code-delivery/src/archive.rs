//! The archive `end` packs: its file name and format, and the exclude globs as the runner
//! reads them. Pure functions: packing is the runner's.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::config::ArchiveFormat;

/// The time every entry of a delivered archive carries (the earliest a zip can hold): the
/// same files make the same archive bytes, whenever they were written, so a replay of the run
/// delivers the recorded archive byte for byte.
pub(crate) const ENTRY_MTIME: &str = "1980-01-01T00:00:00Z";

pub(crate) fn format_name(f: ArchiveFormat) -> &'static str {
    match f {
        ArchiveFormat::Zip => "zip",
        ArchiveFormat::TarGz => "tar.gz",
    }
}

/// The archive's file name and format: the model's name (the extension it carries, or the
/// format's appended) or `<node>.<ext>`.
pub(crate) fn archive_name(
    given: Option<&str>,
    format: Option<ArchiveFormat>,
    default: ArchiveFormat,
    node: &str,
) -> Result<(String, ArchiveFormat), String> {
    let ext_of = |n: &str| {
        let lower = n.to_ascii_lowercase();
        if lower.ends_with(".zip") {
            Some(ArchiveFormat::Zip)
        } else if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            Some(ArchiveFormat::TarGz)
        } else {
            None
        }
    };
    let given = given.map(str::trim).filter(|n| !n.is_empty());
    let Some(name) = given else {
        let f = format.unwrap_or(default);
        return Ok((format!("{node}.{}", format_name(f)), f));
    };
    if name.contains('/') || name.contains('\\') {
        return Err(format!(
            "archive_name `{name}` must be a file name without directories"
        ));
    }
    pathguard::validate(name).map_err(|rej| format!("archive_name `{name}`: {rej}"))?;
    match (ext_of(name), format) {
        (Some(e), Some(f)) if e != f => Err(format!(
            "archive_name `{name}` ends in .{} but archive_format is {}; make them agree",
            format_name(e),
            format_name(f)
        )),
        (Some(e), _) => Ok((name.to_owned(), e)),
        (None, f) => {
            let f = f.unwrap_or(default);
            Ok((format!("{name}.{}", format_name(f)), f))
        }
    }
}

/// The exclude globs as the runner reads them (`**` crosses directories; a pattern naming a
/// directory leaves out everything under it).
pub(crate) fn exclude_set(patterns: &[String]) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_start_matches("./"))
            .literal_separator(true)
            .build()
            .map_err(|e| format!("exclude pattern `{p}` is not a glob: {e}"))?;
        set.add(glob);
    }
    set.build().map_err(|e| format!("exclude patterns: {e}"))
}

/// Whether `path` or one of its directories is excluded.
pub(crate) fn excluded(set: &GlobSet, path: &str) -> bool {
    let mut at = 0;
    while let Some(i) = path[at..].find('/') {
        if set.is_match(&path[..at + i]) {
            return true;
        }
        at += i + 1;
    }
    set.is_match(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn archive_names() {
        let z = ArchiveFormat::Zip;
        let t = ArchiveFormat::TarGz;
        assert_eq!(
            archive_name(None, None, z, "cd").unwrap(),
            ("cd.zip".into(), z)
        );
        assert_eq!(
            archive_name(Some(" "), Some(t), z, "cd").unwrap(),
            ("cd.tar.gz".into(), t)
        );
        assert_eq!(
            archive_name(Some("app"), Some(t), z, "cd").unwrap(),
            ("app.tar.gz".into(), t)
        );
        assert_eq!(
            archive_name(Some("app.tgz"), None, z, "cd").unwrap(),
            ("app.tgz".into(), t)
        );
        assert!(archive_name(Some("app.zip"), Some(t), z, "cd")
            .unwrap_err()
            .contains("make them agree"));
        assert!(archive_name(Some("out/app.zip"), None, z, "cd")
            .unwrap_err()
            .contains("without directories"));
        assert!(archive_name(Some(".."), None, z, "cd").is_err());
    }

    #[test]
    fn excludes_cover_directories() {
        let set = exclude_set(&[".git/**".into(), "build".into(), "*.log".into()]).unwrap();
        assert!(excluded(&set, ".git/config"));
        assert!(excluded(&set, "build/out/a.o"));
        assert!(excluded(&set, "x.log"));
        assert!(!excluded(&set, "src/x.log"), "`*` stays within a directory");
        assert!(!excluded(&set, "README.md"));
        assert!(!excluded(&set, "a.git/x"));
        assert!(exclude_set(&["a[".into()]).is_err());
    }
}
