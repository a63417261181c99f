# placeholder replaced by the cache work
