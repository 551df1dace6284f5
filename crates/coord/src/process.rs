//! Local etcd processes for tests and the lab: one member or a cluster on loopback, on free
//! ports, each with a temporary data dir, killed (SIGKILL) and cleaned up on drop. A member
//! without quorum may ignore SIGTERM for more than 10 s, so this never relies on it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary (`FLOWGATE_ETCD` overrides `etcd` on the PATH).
pub fn etcd_binary() -> String {
    std::env::var("FLOWGATE_ETCD").unwrap_or_else(|_| "etcd".into())
}

/// Is an etcd binary available? (Debian: `apt-get install etcd-server`.)
pub fn etcd_available() -> bool {
    Command::new(etcd_binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

/// An etcd cluster of one or more members on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    initial: String,
    token: String,
}

impl EtcdCluster {
    /// Start `n` members (1 or 3 are the useful sizes) and wait until the cluster takes
    /// writes (at most 20 s).
    pub fn start(tag: &str, n: usize) -> std::io::Result<EtcdCluster> {
        let dir = std::env::temp_dir().join(format!("flowgate-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let initial = initial.join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{client}"),
                peer_url: format!("http://127.0.0.1:{peer}"),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            members,
            dir,
            initial,
            token: format!("flowgate-{tag}-{}", std::process::id()),
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_writable(Duration::from_secs(20))?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let Some(m) = self.members.get(i) else {
            return Ok(());
        };
        let data = self.dir.join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))?;
        // With an existing data dir (a restart) etcd ignores the initial-cluster flags.
        let child = Command::new(etcd_binary())
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &m.client_url,
                "--advertise-client-urls",
                &m.client_url,
            ])
            .args([
                "--listen-peer-urls",
                &m.peer_url,
                "--initial-advertise-peer-urls",
                &m.peer_url,
            ])
            .args([
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", &self.token])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        if let Some(m) = self.members.get_mut(i) {
            m.child = Some(child);
        }
        Ok(())
    }

    /// Start a killed member again on its data dir and ports.
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// Client URLs of every member, for `[cluster] etcd`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// `etcd = [...]` as a TOML array.
    pub fn toml_endpoints(&self) -> String {
        let v: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        format!("[{}]", v.join(", "))
    }

    /// Wait until a write through `etcdctl` succeeds.
    pub fn wait_writable(&self, timeout: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + timeout;
        let endpoints = self.endpoints().join(",");
        loop {
            let ok = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &endpoints,
                    "--command-timeout=1s",
                    "put",
                    "/flowgate-probe",
                    "1",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "etcd did not take writes within {timeout:?} (logs in {})",
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL one member.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members.get_mut(i).and_then(|m| m.child.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The member names and their logs, for a failing test.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!(
                    "--- etcd {} ---\n{}\n",
                    m.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
