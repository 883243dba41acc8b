"""The executor: claims requested executions and places them on live workers."""
