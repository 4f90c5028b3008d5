//! A small filesystem of its own for a test (a full disk, a read-only one).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

use super::{skipped, NEXT};

/// A small tmpfs mounted for one test, unmounted when dropped.
pub struct SmallDisk(pub std::path::PathBuf);

impl SmallDisk {
    /// Mounts one, or None (after one line saying the test is skipped) where mounting is not
    /// allowed.
    pub fn mount(size: &str) -> Option<SmallDisk> {
        let dir = std::env::temp_dir().join(format!(
            "combd-disk-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Some(SmallDisk(dir))
        } else {
            let _ = std::fs::remove_dir(&dir);
            skipped("cannot mount a tmpfs here (needs root)");
            None
        }
    }

    /// Remounts the disk read-only: nobody, root included, can write on it then.
    pub fn remount_read_only(&self) {
        let ok = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount -o remount,ro {}", self.0.display());
    }

    /// A data directory on the disk, for `COMBD_DATA`.
    pub fn data_dir(&self) -> std::path::PathBuf {
        let data = self.0.join("data");
        std::fs::create_dir_all(&data).unwrap();
        data
    }

    /// Fills the filesystem; returns the filler file.
    pub fn fill(&self) -> std::path::PathBuf {
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
