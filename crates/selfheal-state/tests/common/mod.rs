//! A real `redis-server` on a free loopback port, killed when dropped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` this test started.
pub(crate) struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// A port free now (bound to 0, then released).
pub(crate) fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl RedisServer {
    /// Starts one on a free port. Fails — never skips — when `redis-server` is not installed.
    pub(crate) fn start() -> RedisServer {
        let mut s = RedisServer {
            child: None,
            port: free_port(),
        };
        s.restart();
        s
    }

    /// `redis://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it (again) on its port, empty, and waits until it accepts connections.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): these tests need a real Redis. Install it \
                     with `apt-get install -y redis-server` (.ci/run does on a fresh machine)."
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it (its data is gone: it saves nothing).
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) it: a server that accepts but does not answer.
    pub(crate) fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// `redis-cli` would need another package: one command over RESP by hand.
    pub(crate) fn command(&self, args: &[&str]) -> String {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req += &format!("${}\r\n{a}\r\n", a.len());
        }
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = vec![0; 64 * 1024];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A frozen server does not die of SIGKILL until... it does; thaw it anyway.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.stop();
    }
}

/// Polls `f` every 20 ms until it holds, for at most `within`.
pub(crate) async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
