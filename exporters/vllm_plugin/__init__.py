"""loadlens's vLLM general plugin (entry point ``vllm.general_plugins: loadlens``, docs/vllm-plugin.md).

vLLM imports this package in every process it starts, so it imports only the standard library; the hooks
into vLLM are applied lazily, when vLLM itself imports the modules they patch."""

from exporters.vllm_plugin.plugin import ENV_ENABLE, register

__all__ = ["ENV_ENABLE", "register"]
