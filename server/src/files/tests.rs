//! `/view` and upload rules, after the golden captures (get_view_*, post_upload_image_*), plus symlinks.

use std::path::PathBuf;

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::Roots;

use super::upload::Stored;
use super::view::view;
use super::{Upload, UploadError, ViewError, ViewRequest, store_upload};

fn roots(name: &str) -> Roots {
    let base = std::env::temp_dir().join(format!("kiln-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let roots =
        Roots { input: base.join("input"), output: base.join("output"), temp: base.join("temp") };
    for dir in [&roots.input, &roots.output, &roots.temp] {
        std::fs::create_dir_all(dir).expect("root");
    }
    roots
}

fn png(width: u32, alpha: u8) -> Vec<u8> {
    let image = image::RgbaImage::from_pixel(width, 1, image::Rgba([200, 100, 50, alpha]));
    let mut out = std::io::Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).expect("png");
    out.into_inner()
}

fn request(filename: Option<&str>, kind: Option<FileKind>, subfolder: Option<&str>) -> ViewRequest {
    ViewRequest {
        filename: filename.map(str::to_owned),
        kind,
        subfolder: subfolder.map(str::to_owned),
        ..Default::default()
    }
}

#[test]
fn view_serves_a_file_with_comfyuis_headers() {
    let roots = roots("view");
    let bytes = png(2, 255);
    std::fs::write(roots.input.join("tiny.png"), &bytes).expect("write");
    let file =
        view(&roots, &request(Some("tiny.png"), Some(FileKind::Input), None)).expect("served");
    assert_eq!(
        (file.bytes, file.content_type.as_str(), file.content_disposition.as_str()),
        (bytes.clone(), "image/png", "filename=\"tiny.png\"")
    );
    let annotated = view(&roots, &request(Some("tiny.png [input]"), Some(FileKind::Output), None))
        .expect("the annotation wins");
    assert_eq!(annotated.bytes, bytes);
}

#[test]
fn view_refuses_escapes_and_missing_files_like_comfyui() {
    let roots = roots("view-errors");
    assert_eq!(view(&roots, &request(None, None, None)).unwrap_err(), ViewError::NotFound);
    assert_eq!(
        view(&roots, &request(Some("/etc/passwd"), None, None)).unwrap_err(),
        ViewError::BadName
    );
    assert_eq!(
        view(&roots, &request(Some("../../etc/passwd"), None, None)).unwrap_err(),
        ViewError::BadName
    );
    assert_eq!(
        view(&roots, &request(Some("passwd"), None, Some("../../../etc"))).unwrap_err(),
        ViewError::OutsideRoot
    );
    assert_eq!(
        view(&roots, &request(Some("nope.png"), Some(FileKind::Output), None)).unwrap_err(),
        ViewError::NotFound
    );
}

#[cfg(unix)]
#[test]
fn symlinks_out_of_a_root_are_refused() {
    let roots = roots("symlink");
    let outside: PathBuf = roots.input.parent().expect("base").join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret.png"), png(1, 255)).expect("secret");
    std::os::unix::fs::symlink(&outside, roots.output.join("link")).expect("symlink");
    std::os::unix::fs::symlink(outside.join("secret.png"), roots.output.join("secret.png"))
        .expect("file symlink");
    assert_eq!(
        view(&roots, &request(Some("secret.png"), None, Some("link"))).unwrap_err(),
        ViewError::OutsideRoot
    );
    assert_eq!(
        view(&roots, &request(Some("secret.png"), None, None)).unwrap_err(),
        ViewError::OutsideRoot
    );
    let upload = Upload {
        filename: "x.png",
        bytes: b"x",
        kind: FileKind::Output,
        subfolder: "link",
        overwrite: false,
    };
    assert!(matches!(store_upload(&roots, &upload, None), Err(UploadError::OutsideRoot(..))));
    assert!(!outside.join("x.png").exists(), "nothing was written outside the root");
}

#[test]
fn view_transforms_previews_and_channels() {
    let roots = roots("view-transform");
    std::fs::write(roots.output.join("a.png"), png(4, 128)).expect("write");
    let with = |preview: Option<&str>, channel: Option<&str>| {
        let mut r = request(Some("a.png"), None, None);
        r.preview = preview.map(str::to_owned);
        r.channel = channel.map(str::to_owned);
        view(&roots, &r).expect("served")
    };
    let jpeg = with(Some("jpeg;80"), None);
    assert_eq!(jpeg.content_type, "image/jpeg");
    assert_eq!(image::guess_format(&jpeg.bytes).expect("format"), image::ImageFormat::Jpeg);
    let webp = with(Some("webp;90"), None);
    assert_eq!(image::guess_format(&webp.bytes).expect("format"), image::ImageFormat::WebP);
    let rgb = image::load_from_memory(&with(None, Some("rgb")).bytes).expect("png");
    assert_eq!(rgb.color(), image::ColorType::Rgb8);
    let alpha = image::load_from_memory(&with(None, Some("a")).bytes).expect("png").to_rgba8();
    assert_eq!(alpha.get_pixel(0, 0).0, [0, 0, 0, 128]);
}

#[test]
fn script_types_are_downloads_not_pages() {
    let roots = roots("view-html");
    std::fs::write(roots.output.join("page.html"), b"<script>alert(1)</script>").expect("write");
    let file = view(&roots, &request(Some("page.html"), None, None)).expect("served");
    assert_eq!(file.content_type, "application/octet-stream");
    assert!(file.content_disposition.starts_with("attachment; "));
}

#[test]
fn uploads_dedup_rename_overwrite_and_create_subfolders() {
    let roots = roots("upload");
    let first = png(1, 255);
    let other = png(2, 255);
    let up = |bytes: &[u8], subfolder: &str, overwrite: bool| {
        store_upload(
            &roots,
            &Upload { filename: "tiny.png", bytes, kind: FileKind::Input, subfolder, overwrite },
            None,
        )
    };
    let stored = |name: &str, subfolder: &str| Stored {
        name: name.to_owned(),
        subfolder: subfolder.to_owned(),
        kind: FileKind::Input,
    };
    assert_eq!(up(&first, "", false), Ok(stored("tiny.png", "")));
    assert_eq!(
        up(&first, "", false),
        Ok(stored("tiny.png", "")),
        "same content: the name is reused"
    );
    assert_eq!(up(&other, "", false), Ok(stored("tiny (1).png", "")), "other content: renamed");
    assert_eq!(
        up(&other, "", false),
        Ok(stored("tiny (1).png", "")),
        "and that copy is found again"
    );
    assert_eq!(up(&other, "", true), Ok(stored("tiny.png", "")), "overwrite replaces");
    assert_eq!(std::fs::read(roots.input.join("tiny.png")).expect("read"), other);
    assert_eq!(up(&first, "sub/deeper", false), Ok(stored("tiny.png", "sub/deeper")));
    assert!(roots.input.join("sub/deeper/tiny.png").is_file());
}

#[test]
fn uploads_outside_the_root_or_without_a_name_are_refused() {
    let roots = roots("upload-errors");
    let up = |filename: &str, subfolder: &str| {
        store_upload(
            &roots,
            &Upload { filename, bytes: b"x", kind: FileKind::Input, subfolder, overwrite: false },
            None,
        )
    };
    assert_eq!(up("", ""), Err(UploadError::EmptyName));
    assert!(matches!(up("../evil.png", ""), Err(UploadError::OutsideRoot(..))));
    assert!(matches!(up("evil.png", "../.."), Err(UploadError::OutsideRoot(..))));
    assert!(matches!(up("evil.png", "/tmp"), Err(UploadError::OutsideRoot(..))));
    assert!(!roots.input.parent().expect("base").join("evil.png").exists());
}
