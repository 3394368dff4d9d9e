# Text DAT "cudapatch_host": one cudapatch engine for the whole project.
from cudapatch.host_plugin.hosts.touchdesigner import TouchDesignerHost

# Relative file parameters (a composite's or kernel file's Path) are found next to the .toe.
HOST = TouchDesignerHost(device=0, project_folder=project.folder)  # noqa: F821 - `project` is TouchDesigner's global
