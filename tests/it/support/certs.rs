//! Certificates for TLS tests, made with the `openssl` command: a CA of the
//! test's own and certificates it signs, in a folder the test removes.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Ca {
    pub cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
}

impl Ca {
    /// A new CA named `name` in `dir`. `None` without the openssl command.
    pub fn new(dir: &Path, name: &str) -> Option<Ca> {
        std::fs::create_dir_all(dir).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        let made = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", &format!("/CN={name}")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .ok()?;
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        Some(Ca {
            cert,
            key,
            dir: dir.to_owned(),
        })
    }

    /// A server certificate for `names` (`IP:127.0.0.1`, `DNS:db.test`),
    /// signed by this CA: (certificate, key).
    pub fn issue(&self, name: &str, names: &str) -> (PathBuf, PathBuf) {
        let (cert, key, csr, ext) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
            self.dir.join(format!("{name}.csr")),
            self.dir.join(format!("{name}.ext")),
        );
        run(Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-subj", &format!("/CN={name}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr));
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={names}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .unwrap();
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(&self.cert)
            .arg("-CAkey")
            .arg(&self.key)
            .args(["-CAcreateserial", "-extfile"])
            .arg(&ext)
            .arg("-out")
            .arg(&cert));
        (cert, key)
    }
}

fn run(command: &mut Command) {
    let output = command.output().expect("openssl runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
