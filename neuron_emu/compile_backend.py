"""placeholder"""
def compile_stats(): return {}
def reset_compile_stats(): pass
