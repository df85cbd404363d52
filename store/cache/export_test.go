package cache

// Tombstone is what an invalidation leaves in place of an entry.
const Tombstone = tombstone
