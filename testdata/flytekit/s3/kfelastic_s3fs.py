"""s3:// for fsspec, for real flytekit in the e2e worker image.

flytekit reaches S3 through fsspec's "s3" protocol, which s3fs implements;
s3fs (and its aiobotocore) is not packaged in Debian, and no Python package
index is reachable here, so the worker image cannot have it. This is the
part of s3fs flytekit uses (get and put of files and folders, exists, info,
ls, open, rm), synchronous, on Debian's botocore, registered for "s3" by the
entry point beside it (kfelastic_s3fs-0.1.dist-info). It takes s3fs's
arguments as flytekit passes them (key, secret, client_kwargs' endpoint_url,
anon) and ignores the rest. Everything else in the pod is flytekit's own.
"""
import io
import os

import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from fsspec.spec import AbstractFileSystem


class S3FileSystem(AbstractFileSystem):
    protocol = ("s3", "s3a")
    root_marker = ""

    def __init__(self, key=None, secret=None, client_kwargs=None, anon=False, **kwargs):
        for k in ("asynchronous", "loop", "cache_regions", "config_kwargs", "skip_instance_cache", "use_listings_cache"):
            kwargs.pop(k, None)
        super().__init__(**kwargs)
        ck = dict(client_kwargs or {})
        config = Config(s3={"addressing_style": "path"}, signature_version=UNSIGNED if anon else None,
                        retries={"max_attempts": 5, "mode": "standard"})
        self.client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=ck.get("endpoint_url") or os.environ.get("FLYTE_AWS_ENDPOINT"),
            region_name=ck.get("region_name") or os.environ.get("AWS_REGION", "us-east-1"),
            aws_access_key_id=key or os.environ.get("FLYTE_AWS_ACCESS_KEY_ID") or os.environ.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=secret or os.environ.get("FLYTE_AWS_SECRET_ACCESS_KEY") or os.environ.get("AWS_SECRET_ACCESS_KEY"),
            config=config)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        for p in ("s3://", "s3a://"):
            if path.startswith(p):
                path = path[len(p):]
        return path.rstrip("/")

    @staticmethod
    def _split(path):
        bucket, _, key = path.partition("/")
        return bucket, key

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        if not key:
            return {"name": bucket, "size": 0, "type": "directory"}
        try:
            h = self.client.head_object(Bucket=bucket, Key=key)
            return {"name": path, "size": h["ContentLength"], "type": "file", "ETag": h.get("ETag")}
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        r = self.client.list_objects_v2(Bucket=bucket, Prefix=key + "/", MaxKeys=1)
        if r.get("KeyCount", 0) > 0:
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        prefix = key + "/" if key else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            for c in page.get("CommonPrefixes", []):
                out.append({"name": bucket + "/" + c["Prefix"].rstrip("/"), "size": 0, "type": "directory"})
            for o in page.get("Contents", []):
                out.append({"name": bucket + "/" + o["Key"], "size": o["Size"], "type": "file"})
        if not out:
            info = self.info(path)  # a file, or FileNotFoundError
            out = [info] if info["type"] == "file" else []
        return out if detail else [o["name"] for o in out]

    def _open(self, path, mode="rb", **kwargs):
        bucket, key = self._split(self._strip_protocol(path))
        if "r" in mode:
            try:
                body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except ClientError as e:
                raise FileNotFoundError(path) from e
            return io.BytesIO(body)
        return _Upload(self.client, bucket, key)

    def put_file(self, lpath, rpath, callback=None, metadata=None, **kwargs):
        if os.path.isdir(lpath):
            return  # S3 has no folders: the files under it carry its name
        bucket, key = self._split(self._strip_protocol(rpath))
        with open(lpath, "rb") as f:
            self.client.put_object(Bucket=bucket, Key=key, Body=f.read(), Metadata=metadata or {})

    def get_file(self, rpath, lpath, callback=None, **kwargs):
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        bucket, key = self._split(self._strip_protocol(rpath))
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as e:
            raise FileNotFoundError(rpath) from e
        os.makedirs(os.path.dirname(os.path.abspath(lpath)), exist_ok=True)
        with open(lpath, "wb") as f:
            f.write(body)

    def mkdir(self, path, create_parents=True, **kwargs):
        pass

    def makedirs(self, path, exist_ok=False):
        pass

    def rm_file(self, path):
        bucket, key = self._split(self._strip_protocol(path))
        self.client.delete_object(Bucket=bucket, Key=key)

    def _rm(self, path):
        self.rm_file(path)


class _Upload(io.BytesIO):
    """A file opened for writing: put in one request when closed."""

    def __init__(self, client, bucket, key):
        super().__init__()
        self._put = lambda body: client.put_object(Bucket=bucket, Key=key, Body=body)

    def close(self):
        if not self.closed:
            self._put(self.getvalue())
        super().close()
