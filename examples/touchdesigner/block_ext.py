# Extension DAT of a block COMP. The COMP has a custom string parameter "Blocktype".
from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt


class BlockExt(BlockOperatorExt):
    def __init__(self, ownerComp):
        host = op("/project1/cudapatch_host").module.HOST  # noqa: F821 - `op` is TouchDesigner's global
        super().__init__(ownerComp, host, ownerComp.par.Blocktype.eval())

    def onDestroyTD(self):
        self.Dispose()
