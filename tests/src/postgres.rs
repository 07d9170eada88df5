//! A throwaway Postgres cluster for tests: `initdb` into a temporary folder, `pg_ctl start` on a free loopback
//! port, removed when dropped. The real server, from Debian's `postgresql` package (the README's test command
//! installs it if missing); run as the `postgres` user when the tests run as root, as Postgres refuses root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A running Postgres cluster with trust authentication on `127.0.0.1`, superuser `postgres`.
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres_user: bool,
}

impl Postgres {
    /// Creates and starts a cluster. Panics, saying what is missing, if Postgres is not installed.
    pub fn start(name: &str) -> Postgres {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let bin = bin_dir();
        let dir = std::env::temp_dir().join(format!(
            "kiln-postgres-{name}-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the cluster's folder");
        let as_postgres_user = is_root();
        if as_postgres_user {
            check(Command::new("chown").arg("postgres").arg(&dir).output(), "chown");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let cluster = Postgres { bin, dir, port, as_postgres_user };
        let data = cluster.data_dir();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        );
        cluster.start_again();
        cluster
    }

    /// The URL of the `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL of a new, empty database `name` (created now).
    pub fn database(&self, name: &str) -> String {
        let port = self.port.to_string();
        let sql = format!("CREATE DATABASE \"{name}\"");
        self.run("psql", &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-c", &sql]);
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Stops the server (fast shutdown: open connections are closed); [`Postgres::start_again`] restarts it.
    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data_dir(), "-m", "fast", "-w", "stop"]);
    }

    /// Starts the stopped server again, on the same port, and waits until it accepts connections.
    pub fn start_again(&self) {
        let options =
            format!("-c listen_addresses=127.0.0.1 -p {} -k {}", self.port, self.dir.display());
        let log = self.dir.join("postgres.log").display().to_string();
        self.run("pg_ctl", &["-D", &self.data_dir(), "-l", &log, "-o", &options, "-w", "start"]);
    }

    fn data_dir(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// Runs one of Postgres' programs (as the `postgres` user if needed); panics with its output if it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let output = if self.as_postgres_user {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&path).args(args).output()
        } else {
            Command::new(&path).args(args).output()
        };
        check(output, program);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let path = self.bin.join("pg_ctl");
        let data = self.data_dir();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if self.as_postgres_user {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&path).args(args).output()
        } else {
            Command::new(&path).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Postgres' programs: `KILN_POSTGRES_BIN`, else the newest `/usr/lib/postgresql/*/bin` (Debian's layout).
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KILN_POSTGRES_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            Path::new(&bin).join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "Postgres is not installed (no /usr/lib/postgresql/*/bin/initdb): the README's test command \
             installs Debian's postgresql; or set KILN_POSTGRES_BIN"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

fn check(output: std::io::Result<Output>, program: &str) {
    let output = output.unwrap_or_else(|e| panic!("{program} cannot run: {e}"));
    assert!(
        output.status.success(),
        "{program} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
