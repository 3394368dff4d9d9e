# Callbacks DAT of the Script TOP that runs the cudapatch engine.
import numpy

from cudapatch.host_plugin.hosts.touchdesigner import EngineTOP

HOST = op("/project1/cudapatch_host").module.HOST  # noqa: F821 - `op` is TouchDesigner's global
OUTPUT = ("/project1/blur", "Out")  # operator path and output port to show

shape = CUDAMemoryShape()  # noqa: F821 - TouchDesigner's class
shape.width, shape.height, shape.numComps, shape.dataType = 1280, 720, 4, numpy.float32
ENGINE_TOP = EngineTOP(HOST, OUTPUT, shape)


def onSetupParameters(scriptOp):
    return


def onCook(scriptOp):
    ENGINE_TOP.onCook(scriptOp)
