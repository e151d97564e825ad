"""Small end-to-end scripts a user copies (plan_gpt.py, plan_hf_model.py, custom_module.py, run_tiny.sh).

A package so that `examples.custom_module:build` imports from the repository root (PYTHONPATH=.).
"""
