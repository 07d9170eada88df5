//! The ComfyUI frontend Kiln serves by default: the pinned `comfyui-frontend-package` wheel, installed once
//! into `DATA_DIR/frontend/` by `wheel` (sha256 checked, only ever complete), and ComfyUI's
//! `--front-end-version` as Kiln understands it.

use std::path::{Path, PathBuf};

use crate::wheel::{self, Contents, InstallError};

/// The `comfyui-frontend-package` version Kiln serves by default and is tested with.
pub const FRONTEND_VERSION: &str = "1.58.1";

/// Where the pinned wheel is downloaded from by default (PyPI).
pub const FRONTEND_WHEEL_URL: &str = "https://files.pythonhosted.org/packages/1d/7b/\
    dc5fda81cef8d299ab3ff4d3dc34e0c08bf72af546d5815ee7b9f08174f9/\
    comfyui_frontend_package-1.58.1-py3-none-any.whl";

/// The pinned wheel's sha256, as PyPI publishes it; a download that does not match is refused.
const FRONTEND_WHEEL_SHA256: &str =
    "37912597537a731a8f421179618a736c24184c5bdbfa327f38b2fb7c291852d9";

/// ComfyUI's default `--front-end-version`: the frontend that comes with the server.
const COMFYUI_DEFAULT_VERSION: &str = "comfyanonymous/ComfyUI@latest";

/// The frontend's files inside the wheel: its `static/` folder, with `index.html`.
const STATIC_IN_WHEEL: Contents =
    Contents { folder: "comfyui_frontend_package/static", required: Some("index.html") };

/// The pinned wheel, fetched from `url` (PyPI or a mirror); the pinned sha256 applies wherever it comes from.
pub(crate) fn pinned_wheel(url: &str) -> wheel::Wheel {
    wheel::Wheel { url: url.to_owned(), sha256: FRONTEND_WHEEL_SHA256.to_owned() }
}

/// The one line a user reads when the frontend cannot be had: what failed, with its causes, and what to do.
pub(crate) fn advice(error: &InstallError) -> String {
    format!(
        "cannot download the ComfyUI frontend ({}): pass --front-end-root DIR or run once with network \
         access; the API works without it",
        error.reason()
    )
}

/// The folder that holds (or will hold) the frontend of `version` under `data_dir`.
fn install_dir(data_dir: &Path, version: &str) -> PathBuf {
    data_dir.join("frontend").join(format!("comfyui-frontend-package-{version}"))
}

/// The installed frontend's folder: the installed copy when there is one (no request is made), otherwise
/// `wheel` (of `version`) downloaded, checked and unpacked into place, with a progress bar on a terminal. Runs
/// once at startup, before anything is served.
pub(crate) async fn ensure(
    data_dir: &Path,
    wheel: &wheel::Wheel,
    version: &str,
) -> Result<PathBuf, InstallError> {
    let target = install_dir(data_dir, version);
    if STATIC_IN_WHEEL.installed_in(&target) {
        tracing::info!("serving the ComfyUI frontend {version} from {}", target.display());
        return Ok(target);
    }
    tracing::info!(
        "downloading the ComfyUI frontend (comfyui-frontend-package {version}) once, from {} into {}",
        wheel.url,
        target.display()
    );
    let bar = wheel::progress_bar("ComfyUI frontend", None);
    let files = wheel::install(wheel, STATIC_IN_WHEEL, &target, &bar).await?;
    bar.finish();
    tracing::info!(
        "installed the ComfyUI frontend {version} ({files} files, sha256 checked) in {}",
        target.display()
    );
    Ok(target)
}

/// What ComfyUI's `--front-end-version OWNER/REPO@VERSION` asks of Kiln.
#[derive(Debug, Clone, PartialEq)]
pub enum FrontEndVersion {
    /// ComfyUI's default (`comfyanonymous/ComfyUI@latest`) or the pinned version itself: the pinned frontend.
    Pinned,
    /// Another version: Kiln serves only the frontend it is tested with, so the pinned one is served instead
    /// (as ComfyUI falls back to its default frontend when a version cannot be had).
    Other(String),
}

impl FrontEndVersion {
    /// Parses ComfyUI's version string; anything not shaped `OWNER/REPO@VERSION` is refused, as ComfyUI does.
    pub fn parse(value: &str) -> Result<FrontEndVersion, String> {
        let invalid = || {
            format!(
                "`{value}` is not a frontend version string (OWNER/REPO@VERSION, e.g. \
                 Comfy-Org/ComfyUI_frontend@{FRONTEND_VERSION})"
            )
        };
        let (repo, version) = value.split_once('@').ok_or_else(invalid)?;
        let (owner, name) = repo.split_once('/').ok_or_else(invalid)?;
        let word = |s: &str, extra: &str| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        // `X.Y.Z`, with an optional `v` before and a suffix of word characters after (`1.2.3-rc1`).
        let semver = |v: &str| {
            let mut rest = v.strip_prefix('v').unwrap_or(v);
            for part in 0..3 {
                let digits =
                    rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                if digits == 0 {
                    return false;
                }
                rest = &rest[digits..];
                if part < 2 {
                    let Some(after) = rest.strip_prefix('.') else { return false };
                    rest = after;
                }
            }
            rest.is_empty() || word(rest, "-._")
        };
        if !(word(owner, "-")
            && word(name, "_.-")
            && (semver(version) || version == "latest" || version == "prerelease"))
        {
            return Err(invalid());
        }
        let pinned_version = version.strip_prefix('v').unwrap_or(version) == FRONTEND_VERSION;
        if value == COMFYUI_DEFAULT_VERSION
            || (repo.eq_ignore_ascii_case("Comfy-Org/ComfyUI_frontend") && pinned_version)
        {
            Ok(FrontEndVersion::Pinned)
        } else {
            Ok(FrontEndVersion::Other(value.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::wheel::tests::{scratch, sha256_hex, wheel_bytes};

    #[tokio::test]
    async fn ensure_installs_the_static_folder_once_then_uses_the_installed_copy() {
        let data_dir = scratch("frontend-ensure");
        let bytes = wheel_bytes(&[
            ("comfyui_frontend_package/__init__.py", b"x"),
            ("comfyui_frontend_package/static/index.html", b"<html>pinned</html>"),
            ("comfyui_frontend_package/static/assets/app.js", b"app"),
        ]);
        let (url, requests) = kiln_tests::serve_wheel(bytes.clone()).await;
        let wheel = wheel::Wheel { url, sha256: sha256_hex(&bytes) };

        let root = ensure(&data_dir, &wheel, "0.0.1-test").await.expect("installs");
        assert_eq!(root, data_dir.join("frontend/comfyui-frontend-package-0.0.1-test"));
        assert_eq!(std::fs::read(root.join("index.html")).expect("index"), b"<html>pinned</html>");
        assert_eq!(std::fs::read(root.join("assets/app.js")).expect("asset"), b"app");
        assert!(!root.join("__init__.py").exists());
        assert_eq!(ensure(&data_dir, &wheel, "0.0.1-test").await.expect("cached"), root);
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "the installed copy is used without a request"
        );
        let _ = std::fs::remove_dir_all(&data_dir);
    }

    #[test]
    fn the_advice_is_one_line_with_the_causes_and_what_to_do() {
        let error = InstallError::Io {
            what: "create",
            path: PathBuf::from("/x"),
            source: std::io::Error::other("disk\nfull"),
        };
        assert_eq!(
            advice(&error),
            "cannot download the ComfyUI frontend (cannot create /x: disk full): pass --front-end-root DIR or \
             run once with network access; the API works without it"
        );
    }

    #[test]
    fn front_end_versions_follow_comfyuis_syntax() {
        use FrontEndVersion::{Other, Pinned};
        let parse = FrontEndVersion::parse;
        assert_eq!(parse("comfyanonymous/ComfyUI@latest"), Ok(Pinned));
        assert_eq!(parse("Comfy-Org/ComfyUI_frontend@1.58.1"), Ok(Pinned));
        assert_eq!(parse("comfy-org/comfyui_frontend@v1.58.1"), Ok(Pinned));
        assert_eq!(
            parse("Comfy-Org/ComfyUI_frontend@latest"),
            Ok(Other("Comfy-Org/ComfyUI_frontend@latest".into()))
        );
        assert_eq!(
            parse("Comfy-Org/ComfyUI_frontend@1.2.3-rc1"),
            Ok(Other("Comfy-Org/ComfyUI_frontend@1.2.3-rc1".into()))
        );
        assert_eq!(parse("someone/fork@1.58.1"), Ok(Other("someone/fork@1.58.1".into())));
        for bad in [
            "1.58.1",
            "Comfy-Org@1.58.1",
            "Comfy-Org/ComfyUI_frontend@newest",
            "a/b@1.2",
            "/x@1.2.3",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains("not a frontend version string"), "{error}");
        }
    }
}
