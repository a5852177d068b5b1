//! Running as a service (docs/deploy/service.md): the systemd unit passes
//! `systemd-analyze verify`, and the unit, the container recipe and the
//! config they share agree on the config's path, the data directory, the
//! port and the user.
//!
//! `systemd-analyze` comes with Debian's `systemd`; `.ci/run` installs it.
//! Elsewhere a missing one skips that check with a message, except under
//! `CI=true`, where it fails.

use crate::common;

use relay::config::Config;
use std::path::{Path, PathBuf};
use std::process::Command;

fn contrib(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(contrib(name)).unwrap()
}

/// The values of the lines starting with `key` (`Key=` in a unit,
/// `INSTRUCTION ` in a Containerfile), in order.
fn values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines().filter_map(|l| l.strip_prefix(key)).map(str::trim).collect()
}

fn one<'a>(text: &'a str, key: &str) -> &'a str {
    match values(text, key).as_slice() {
        [v] => v,
        other => panic!("{key}: expected one line, found {other:?}"),
    }
}

/// The service config: the path both recipes read it from, and what it says.
const CONFIG_AT: &str = "/etc/relay/relay.toml";

fn service_config() -> Config {
    Config::load(&contrib("relay.toml")).expect("contrib/relay.toml loads")
}

fn port(listen: &str) -> &str {
    listen.rsplit(':').next().unwrap()
}

#[test]
fn the_systemd_unit_is_hardened_verifies_and_keeps_the_data_in_its_state_directory() {
    let unit = read("systemd/relay.service");
    assert_eq!(one(&unit, "ExecStart="), format!("/usr/local/bin/relay serve --config {CONFIG_AT}"));
    assert_eq!(one(&unit, "ExecStartPre="), format!("/usr/local/bin/relay config check --config {CONFIG_AT}"));
    let cfg = service_config();
    assert_eq!(cfg.relay.data_dir, Path::new("/var/lib").join(one(&unit, "StateDirectory=")));
    assert!(cfg.relay.key_file.starts_with(&cfg.relay.data_dir), "the key is state too");
    for (key, value) in [
        ("DynamicUser=", "yes"),
        ("NoNewPrivileges=", "yes"),
        ("ProtectSystem=", "strict"),
        ("ProtectHome=", "yes"),
        ("PrivateTmp=", "yes"),
        ("CapabilityBoundingSet=", ""),
        ("RestrictAddressFamilies=", "AF_INET AF_INET6 AF_UNIX"),
        ("KillSignal=", "SIGTERM"),
    ] {
        assert_eq!(one(&unit, key), value, "{key}");
    }

    let missing = match Command::new("systemd-analyze").arg("--version").output() {
        Ok(_) => None,
        Err(_) => Some("systemd-analyze is not installed (apt-get install -y systemd)".to_owned()),
    };
    if !common::can_run("the_systemd_unit_is_hardened_verifies_and_keeps_the_data_in_its_state_directory", missing) {
        return;
    }
    // The unit as installed, with this build's binary where it would be
    // (verify checks that the commands exist).
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("relay.service");
    std::fs::write(&installed, unit.replace("/usr/local/bin/relay", env!("CARGO_BIN_EXE_relay"))).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&installed).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // An unknown key is only a warning: any output is a finding.
    assert!(out.status.success() && err.trim().is_empty(), "systemd-analyze verify: {}\n{err}", out.status);
}

#[test]
fn the_container_runs_the_service_config_as_a_user_with_the_data_on_a_volume() {
    let file = read("container/Containerfile");
    let cfg = service_config();
    assert!(values(&file, "FROM ").len() >= 2, "multi-stage: the toolchain stays in the build stage");
    assert_eq!(one(&file, "COPY contrib/relay.toml "), CONFIG_AT);
    assert_eq!(one(&file, "CMD "), format!(r#"["serve", "--config", "{CONFIG_AT}"]"#));
    assert_eq!(one(&file, "ENTRYPOINT "), r#"["/usr/local/bin/relay"]"#);
    assert_eq!(one(&file, "COPY --from=build "), "/src/target/fastest/relay /usr/local/bin/relay");
    assert_eq!(Path::new(one(&file, "VOLUME ")), cfg.relay.data_dir);

    // A numbered user that is not root, made in the image and owning the volume.
    let user = one(&file, "USER ");
    let uid = user.split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|n| n != 0), "{user}");
    assert!(file.contains(&format!("useradd --system --uid {uid} ")), "{file}");
    assert!(file.contains(&format!("install -d -o {uid} ")), "{file}");

    // It listens on every interface of the container, on the port it exposes
    // and the config names.
    let listen = values(&file, "ENV RELAY__RELAY__LISTEN=")[0].split_whitespace().next().unwrap();
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    assert_eq!(one(&file, "EXPOSE "), port(listen));
    assert_eq!(port(listen), port(&cfg.relay.listen));

    let (ok, out) = {
        let out = Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["config", "check", "--config"])
            .arg(contrib("relay.toml"))
            .env("RELAY__RELAY__LISTEN", listen)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert!(ok && out == "ok\n", "{out}");
}
