"""The single-user server's settings for labkit (copied to <environment>/etc/jupyter/ of each role's environment).

The chapters are stored without the kernel's language_info; this contents manager fills it in as the kernel
will report it, so JupyterLab opens a chapter unmodified (what `python3 course.py lab` passes on its command line).
"""
c = get_config()  # noqa: F821 -- Jupyter provides get_config

c.ServerApp.contents_manager_class = "labkit.base.jupyter_contents.KernelLanguageContents"
