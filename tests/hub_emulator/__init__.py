"""A loopback emulator of the Hugging Face Hub and ModelScope HTTP APIs, for tests.

The real `huggingface_hub` and `modelscope-hub` clients talk to it unchanged (contract in
/work/shared/reference/hubs.md sections 3.2 and 3.3). Stdlib only:

    with HubEmulator() as hub:                 # ThreadingHTTPServer on 127.0.0.1, port 0
        hub.url                                # http://127.0.0.1:PORT (HF_ENDPOINT and MODELSCOPE_ENDPOINT)
        hub.seed("hf", "Zhongzhu/OSCAR-RotationZoo", {"A/k.pt": b"..."})
        hub.fail("GET", r"/resolve/", status=500, times=2)     # fault injection
        hub.fail("POST", r"/commit/", status=429, times=1, retry_after=1)  # with Retry-After
        hub.truncate(r"/resolve/.*k\\.pt", after=1000)          # cut a body short (stall= to hang)
        hub.corrupt(r"/resolve/")                               # flip a byte of the next body
        hub.delay("PUT", r"/_lfs/", seconds=30)                 # hang an upload
        hub.lose_response("POST", r"/commit/", status=504)      # commit, then answer 504
        hub.tokens = {"hf_test", "ms_test"}                    # writes need one of these
        hub.log                                # [(method, path), ...]
        hub.exchanges                          # [Exchange(method, path, arrived, answered, status)]

    point_hf_client_at(hub.url, monkeypatch)   # also for a huggingface_hub imported earlier
"""

from .server import HubEmulator, Repo, git_sha1


def point_hf_client_at(url: str, monkeypatch) -> None:
    """Point an already imported huggingface_hub at `url` (HF_ENDPOINT is set separately).

    huggingface_hub reads HF_ENDPOINT once, at import, into ENDPOINT and the resolve-URL
    template; an earlier test may have imported it. A user sets HF_ENDPOINT before the process
    starts, so only tests need this.
    """
    try:
        import huggingface_hub.constants as hf_constants
    except ImportError:
        return
    monkeypatch.setattr(hf_constants, "ENDPOINT", url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        url + "/{repo_id}/resolve/{revision}/{filename}")


__all__ = ["HubEmulator", "Repo", "git_sha1", "point_hf_client_at"]
