//! A real S3 server for tests: s3s (the S3 protocol, signature checks included) over s3s-fs (objects as files
//! in a temporary folder), on a loopback port, on a thread of its own so that it outlives any test's runtime.
//!
//! One addition to s3s-fs: a conditional put (`If-None-Match: *`) is atomic here, as it is on S3. s3s-fs checks
//! that the object is absent and then writes it, so two racing creates could both succeed; this server makes
//! puts one at a time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::error_handling::HandleError;
use s3s::dto::{
    CreateBucketInput, CreateBucketOutput, DeleteObjectInput, DeleteObjectOutput,
    DeleteObjectsInput, DeleteObjectsOutput, GetObjectInput, GetObjectOutput, HeadBucketInput,
    HeadBucketOutput, HeadObjectInput, HeadObjectOutput, ListObjectsV2Input, ListObjectsV2Output,
    PutObjectInput, PutObjectOutput,
};
use s3s::{S3, S3Request, S3Response, S3Result};

/// The access key the server accepts.
pub const ACCESS_KEY: &str = "kiln-test";
/// Its secret.
pub const SECRET_KEY: &str = "kiln-test-secret";

/// A running S3 server with one bucket, `kiln`; stopped when dropped.
pub struct S3Server {
    port: u16,
    dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    gets: Arc<AtomicUsize>,
}

impl S3Server {
    /// Starts a server whose objects live in a new temporary folder.
    pub fn start(name: &str) -> S3Server {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kiln-s3-{name}-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kiln")).expect("the bucket's folder");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let backend = s3s_fs::FileSystem::new(&dir).expect("the s3s-fs backend");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let gets = Arc::new(AtomicUsize::new(0));
        let counted = gets.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the S3 server's runtime");
            runtime.block_on(async move {
                let mut builder = s3s::service::S3ServiceBuilder::new(AtomicPuts {
                    inner: backend,
                    puts: tokio::sync::Mutex::new(()),
                    gets: counted,
                });
                builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
                let service = HandleError::new(builder.build(), |e: s3s::HttpError| async move {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("{e:?}"))
                });
                let app = axum::Router::new().fallback_service(service);
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    let _ = stopped.await;
                });
                serve.await.expect("the S3 server");
            });
        });
        S3Server { port, dir, stop: Some(stop), thread: Some(thread), gets }
    }

    /// The server's URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `--store` for the bucket: `s3://kiln?endpoint=…&allow_http=true&region=us-east-1`.
    pub fn store_url(&self) -> String {
        format!("s3://kiln?endpoint={}&allow_http=true&region=us-east-1", self.endpoint())
    }

    /// The environment a Kiln process needs to sign its requests.
    pub fn credentials(&self) -> [(&'static str, &'static str); 2] {
        [("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)]
    }

    /// How many `GetObject` requests the server has answered (range reads included).
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// The folder of an object's file (`key` as stored: `workspace/output/name.png`), to look at directly.
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.dir.join("kiln").join(key)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// s3s-fs with puts made one at a time (see the module's note) and gets counted; the operations
/// `object_store` uses.
struct AtomicPuts {
    inner: s3s_fs::FileSystem,
    puts: tokio::sync::Mutex<()>,
    gets: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl S3 for AtomicPuts {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.inner.create_bucket(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.inner.head_bucket(req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let _one_at_a_time = self.puts.lock().await;
        self.inner.put_object(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_object(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.inner.head_object(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.inner.list_objects_v2(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let _one_at_a_time = self.puts.lock().await;
        self.inner.delete_object(req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let _one_at_a_time = self.puts.lock().await;
        self.inner.delete_objects(req).await
    }
}
