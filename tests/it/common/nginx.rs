//! Debian's nginx as a TLS-terminating reverse proxy in front of a relay:
//! one process (`master_process off`) in the foreground, its config, pid,
//! logs and temp paths in a directory of the test's, listening on a
//! loopback port; killed when dropped. `/usr/sbin/nginx`, or the binary
//! the `NGINX` environment variable names.

use super::tls::Issued;
use super::wait::eventually_blocking;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn binary() -> PathBuf {
    std::env::var_os("NGINX").map(PathBuf::from).unwrap_or_else(|| "/usr/sbin/nginx".into())
}

/// What is missing to run nginx, if anything (see [`super::can_run`]).
pub fn missing() -> Option<String> {
    (!binary().exists()).then(|| format!("{} is missing (apt-get install -y nginx-light)", binary().display()))
}

pub struct Nginx {
    child: Child,
    /// `https://127.0.0.1:port`, nginx's own address.
    pub url: String,
}

impl Nginx {
    /// Proxies `https://127.0.0.1:<free port>` (certificate `cert`) to the
    /// relay at `upstream` (`http://127.0.0.1:port`), WebSocket upgrades
    /// included, appending the client's address to `X-Forwarded-For`.
    pub fn start(dir: &Path, upstream: &str, cert: &Issued) -> Nginx {
        let port = super::cluster::free_port();
        let at = |name: &str| dir.join(name).display().to_string();
        let conf = format!(
            r#"daemon off;
master_process off;
pid {pid};
error_log {error} info;
events {{ worker_connections 256; }}
http {{
    access_log {access};
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"#,
            pid = at("nginx.pid"),
            error = at("nginx-error.log"),
            access = at("nginx-access.log"),
            tmp = dir.display(),
            cert = cert.cert.display(),
            key = cert.key.display(),
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(binary())
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("nginx-error.log"))
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx { child, url: format!("https://127.0.0.1:{port}") };
        eventually_blocking("nginx listens", Duration::from_secs(10), || {
            if let Ok(Some(exit)) = nginx.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("nginx-error.log")).unwrap_or_default();
                panic!("nginx exited ({exit}):\n{log}");
            }
            std::net::TcpStream::connect(("127.0.0.1", port)).map(drop).map_err(|e| e.to_string())
        });
        nginx
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
