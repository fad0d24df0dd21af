"""What a name, path, image reference or listen address in a config may be.

Model names become directories of the Triton model repository and path segments of its URLs
(`/v2/models/<name>/generate`); `name` becomes the workdir folder. So each is one safe path component:
Triton itself only requires that a model's directory name equals the `name` in its config.pbtxt
(Triton's model_repository.md), which rules out separators; quotes and newlines would break out of the
config.pbtxt string, a leading `-` reads as a flag. The image reference follows the grammar of
github.com/distribution/reference (regexp.go), which Docker and Kubernetes parse images with.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
NAME_RULE = "use letters, digits, '_', '-' and '.', starting with a letter, digit or '_' (at most 128 characters)"

# github.com/distribution/reference regexp.go: [domain/]path[:tag][@digest]
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")
MAX_IMAGE_REFERENCE = 512

_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
WILDCARD_ADDRESSES = {"0.0.0.0", "::"}
MAX_PATH_CHARS = 4096
MAX_PATH_COMPONENT_BYTES = 255


def check_name(value: str) -> str:
    if value in (".", "..") or not NAME.fullmatch(value):
        raise ValueError(f"not a valid model or deployment name: it becomes a directory and a URL path segment; {NAME_RULE}")
    return value


def check_image_reference(value: str) -> str:
    if len(value) > MAX_IMAGE_REFERENCE or not IMAGE_REFERENCE.fullmatch(value):
        raise ValueError(
            "not an image reference such as nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3 "
            "([registry/]repository[:tag][@sha256:digest]; lower-case repository, no spaces or leading '-')"
        )
    return value


def is_host_name(value: str) -> bool:
    if re.fullmatch(r"[0-9.]+", value):  # digits and dots only: a mistyped IPv4 address, not a name
        return False
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in value.rstrip(".").split("."))


def check_bind_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not value or not is_host_name(value):
        raise ValueError(
            "not an IP address or host name; use 127.0.0.1 (this machine only), a host name, or 0.0.0.0 to listen on every interface"
        )
    return value


def binds_every_interface(address: str) -> bool:
    return address in WILDCARD_ADDRESSES


def check_local_path(value: str) -> str:
    if not value:
        raise ValueError("is empty; give a path")
    if "\0" in value:
        raise ValueError("contains a NUL character, which no path can hold")
    if len(value) > MAX_PATH_CHARS or any(len(part.encode()) > MAX_PATH_COMPONENT_BYTES for part in Path(value).parts):
        raise ValueError(f"is longer than a path can be ({MAX_PATH_CHARS} characters, {MAX_PATH_COMPONENT_BYTES} bytes per name)")
    if value.startswith("~"):
        try:
            Path(value).expanduser()
        except RuntimeError:
            user = value.split("/")[0]
            raise ValueError(f"{user} is not a user with a home directory here; write the path out") from None
    return value
