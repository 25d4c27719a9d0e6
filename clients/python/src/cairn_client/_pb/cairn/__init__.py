"""Generated from proto/ by gen_stubs.py; do not edit."""
