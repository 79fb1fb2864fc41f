"""The notebooks as this machine's kernel would describe them, so JupyterLab opens them unmodified.

JupyterLab writes the kernel's ``language_info`` (Python's version among it) into a notebook's metadata as
soon as the kernel starts, and marks the notebook unsaved when that differs from the file. The chapters are
stored without a version (it differs on every learner's machine), so every chapter opened "unsaved". The
server started by ``course.py lab`` reads them through this contents manager, which fills in what the
kernel will say (the server and the kernel run in the same environment). Nothing is written to the files:
a learner's own save stores what JupyterLab shows, as before.

    jupyter lab --ServerApp.contents_manager_class=labkit.base.jupyter_contents.KernelLanguageContents
"""
from __future__ import annotations

from ipykernel.ipkernel import IPythonKernel
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

OPTION = "--ServerApp.contents_manager_class=labkit.base.jupyter_contents.KernelLanguageContents"


def with_kernel_language(model: dict) -> dict:
    """A notebook's contents model with its ``language_info`` as this environment's Python kernel reports
    it; anything else (a file, a folder, a notebook for another kernel) is returned unchanged."""
    nb = model.get("content") if model.get("type") == "notebook" else None
    if not nb or nb.get("metadata", {}).get("kernelspec", {}).get("language", "python") != "python":
        return model
    nb["metadata"]["language_info"] = {**nb["metadata"].get("language_info", {}),
                                       **IPythonKernel.language_info}
    return model


class KernelLanguageContents(AsyncLargeFileManager):
    """JupyterLab's default contents manager, reading notebooks through ``with_kernel_language``."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):  # noqa: A002 -- the base's names
        return with_kernel_language(await super().get(path, content=content, type=type, format=format, **kwargs))
