//! The relay's own Ed25519 key (it signs relay-to-relay requests). Stored as
//! the base64url 32-byte seed in a file only its owner may read.

use ed25519_dalek::SigningKey;
use relay_schemas::encoding::{b64_decode_array, b64_encode};
use std::io::Write;
use std::path::Path;

pub fn public_key(key: &SigningKey) -> String {
    b64_encode(key.verifying_key().as_bytes())
}

/// Writes a new key to `path` (mode 0600, refusing to overwrite).
pub fn generate(path: &Path) -> Result<SigningKey, String> {
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    write_private(path, &b64_encode(&key.to_bytes()))?;
    Ok(key)
}

/// Writes `line` to a new file at `path` that only its owner may read
/// (0600), refusing to overwrite; synced before it returns.
pub fn write_private(path: &Path, line: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
    f.sync_all().map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the key at `path`, refusing one that others can read.
pub fn load(path: &Path) -> Result<SigningKey, String> {
    let text = read_private(path)?;
    let seed: [u8; 32] =
        b64_decode_array("key", text.trim()).map_err(|_| format!("{}: not a relay key", path.display()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The text of a key file, refused when others can read it.
pub fn read_private(path: &Path) -> Result<String, String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{}: key file is readable by others (mode {:o}); chmod 600 it",
                path.display(),
                mode & 0o777
            ));
        }
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The key at `path`, generated on first start.
pub fn load_or_generate(path: &Path) -> Result<SigningKey, String> {
    if path.exists() {
        load(path)
    } else {
        generate(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_key_is_private_to_its_owner_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k/relay.key");
        let key = generate(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(load(&path).unwrap().to_bytes(), key.to_bytes());
        assert!(generate(&path).is_err(), "never overwrites a key");
    }

    #[cfg(unix)]
    #[test]
    fn world_readable_key_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.key");
        generate(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load(&path).unwrap_err().contains("readable by others"));
    }
}
