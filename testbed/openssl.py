"""The few OpenSSL calls Python's ssl module lacks, made on the library it runs on.

Each one is a shortcut with a way back: without the library's symbols (another Python,
OpenSSL linked in statically) they return False or do nothing, and the caller does what
the ssl module offers, only slower.
"""

from __future__ import annotations

import _ssl
import ctypes
import functools
import ssl
import sys
from typing import Any

_SSL_CTRL_MODE = 33
_SSL_MODE_NO_AUTO_CHAIN = 0x8
_EVP_PKEY_EC = 408

_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "SSL_CTX_ctrl": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p], ctypes.c_long),
    "SSL_CTX_get_cert_store": ([ctypes.c_void_p], ctypes.c_void_p),
    "SSL_CTX_set1_cert_store": ([ctypes.c_void_p, ctypes.c_void_p], None),
    "SSL_CTX_use_certificate_ASN1": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p], ctypes.c_int),
    "SSL_CTX_use_PrivateKey_ASN1": ([ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long], ctypes.c_int),
    "SSL_CTX_check_private_key": ([ctypes.c_void_p], ctypes.c_int),
    "ERR_clear_error": ([], None),
}


@functools.cache
def _library() -> Any:
    """libssl as Python's ssl module loaded it, its functions typed; None without them."""
    if sys.implementation.name != "cpython":
        return None
    try:
        library = ctypes.CDLL(_ssl.__file__)
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, restype
    except (AttributeError, OSError):
        return None
    return library


def _ssl_ctx(context: ssl.SSLContext) -> int | None:
    """The context's SSL_CTX: the first field after the object header of CPython's context."""
    pointer: int | None = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    return pointer


def send_certificate_alone(context: ssl.SSLContext) -> None:
    """Present the client certificate without its issuer, as Go clients (kubelet, kubectl)
    do. OpenSSL otherwise appends the chain it can build from the trust store, the
    cluster CA itself; the API server then checks that "intermediate" too, in each of its
    certificate authenticators, on every request: a quarter of its CPU for a GET."""
    library = _library()
    pointer = _ssl_ctx(context)
    if library is not None and pointer:
        library.SSL_CTX_ctrl(pointer, _SSL_CTRL_MODE, _SSL_MODE_NO_AUTO_CHAIN, None)


def share_trust_store(context: ssl.SSLContext, source: ssl.SSLContext) -> bool:
    """Make ``context`` trust what ``source`` trusts, through the same store: parsing the
    CA again for each of a host's hundreds of node contexts cost 0.2 ms each."""
    library = _library()
    pointer, source_pointer = _ssl_ctx(context), _ssl_ctx(source)
    if library is None or not pointer or not source_pointer:
        return False
    store = library.SSL_CTX_get_cert_store(source_pointer)
    if not store:
        return False
    library.SSL_CTX_set1_cert_store(pointer, store)  # takes a reference: the store outlives source
    return True


def use_der_key_pair(context: ssl.SSLContext, cert_der: bytes, key_der: bytes) -> bool:
    """Give ``context`` this client certificate and P-256 key (PKCS#8), both DER. The ssl
    module loads pairs from a PEM file only, which cost a NodeHost 0.9 ms per node; DER
    straight into the context costs half that. False when the library is out of reach
    (the context untouched): load PEM instead. SSLError when OpenSSL refuses the pair."""
    library = _library()
    pointer = _ssl_ctx(context)
    if library is None or not pointer:
        return False
    done = (
        library.SSL_CTX_use_certificate_ASN1(pointer, len(cert_der), cert_der) == 1
        and library.SSL_CTX_use_PrivateKey_ASN1(_EVP_PKEY_EC, pointer, key_der, len(key_der)) == 1
        and library.SSL_CTX_check_private_key(pointer) == 1
    )
    if not done:
        library.ERR_clear_error()  # the ssl module would report a stale error on its next failure
        raise ssl.SSLError("OpenSSL refused the client certificate or its key (not a P-256 key pair that matches?)")
    send_certificate_alone(context)
    return True
