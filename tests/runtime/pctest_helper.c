// The dependency of the "missing dependency" test plugin; it is built into a directory the
// loader does not search, so the plugin's DT_NEEDED entry stays unresolved.
int pctest_helper_value(void) { return 42; }
