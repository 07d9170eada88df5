//! `POST /api/upload/image` and `/api/upload/mask`, written by hand: their multipart bodies are beyond
//! progenitor (see `kiln_codegen::HAND_WRITTEN`).

use progenitor_client::{Error, ResponseValue};
use reqwest::multipart::{Form, Part};

use crate::{Client, types};

/// Where and how an upload is stored.
#[derive(Debug, Clone, Default)]
pub struct UploadOptions {
    /// The root to store into; the server's default (`input`) when `None`.
    pub type_: Option<types::FileType>,
    /// A folder under the root, created if missing.
    pub subfolder: Option<String>,
    /// Replace a file of the same name instead of renaming the upload `name (n).ext`.
    pub overwrite: bool,
}

impl Client {
    /// Uploads a file into the input (default), output or temp directory under `filename`.
    pub async fn upload_image(
        &self,
        filename: &str,
        bytes: impl Into<bytes::Bytes>,
        options: &UploadOptions,
    ) -> Result<ResponseValue<types::UploadImageResponse>, Error<types::ErrorResponse>> {
        let form = upload_form(filename, bytes.into(), options);
        self.send_upload("/api/upload/image", form).await
    }

    /// Uploads a mask: its alpha channel is copied onto the image named by `original` and stored as
    /// `filename`.
    pub async fn upload_mask(
        &self,
        filename: &str,
        bytes: impl Into<bytes::Bytes>,
        original: &types::FileRef,
        options: &UploadOptions,
    ) -> Result<ResponseValue<types::UploadImageResponse>, Error<types::ErrorResponse>> {
        let original = serde_json::to_string(original)
            .map_err(|e| Error::InvalidRequest(format!("original_ref does not serialize: {e}")))?;
        let form = upload_form(filename, bytes.into(), options).text("original_ref", original);
        self.send_upload("/api/upload/mask", form).await
    }

    async fn send_upload(
        &self,
        path: &str,
        form: Form,
    ) -> Result<ResponseValue<types::UploadImageResponse>, Error<types::ErrorResponse>> {
        let response = self
            .client
            .post(format!("{}{path}", self.baseurl))
            .multipart(form)
            .send()
            .await
            .map_err(Error::CommunicationError)?;
        match response.status().as_u16() {
            200 => ResponseValue::from_response(response).await,
            400 | 413 => Err(Error::ErrorResponse(ResponseValue::from_response(response).await?)),
            _ => Err(Error::UnexpectedResponse(response)),
        }
    }
}

fn upload_form(filename: &str, bytes: bytes::Bytes, options: &UploadOptions) -> Form {
    let mut form = Form::new().part("image", Part::stream(bytes).file_name(filename.to_owned()));
    if let Some(type_) = options.type_ {
        form = form.text("type", type_.to_string());
    }
    if let Some(subfolder) = &options.subfolder {
        form = form.text("subfolder", subfolder.clone());
    }
    if options.overwrite {
        form = form.text("overwrite", "true");
    }
    form
}
