# Text DAT "cudapatch_host": one cudapatch engine for the whole project.
from cudapatch.host_plugin.hosts.touchdesigner import TouchDesignerHost

HOST = TouchDesignerHost(device=0)
