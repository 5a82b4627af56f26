//! A global allocator that counts live heap bytes, and live blocks by size,
//! so that what a structure holds is an allocation delta.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live bytes allocated through it; install with `#[global_allocator]`.
pub struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

pub const SIZE_CLASS: usize = 16;
const SIZE_CLASSES: usize = 2048;
/// Live blocks per size class (class `i` holds sizes `16 i + 1 ..= 16 (i + 1)`).
static LIVE_BLOCKS: [AtomicIsize; SIZE_CLASSES] = [const { AtomicIsize::new(0) }; SIZE_CLASSES];

fn class_of(size: usize) -> usize {
    (size.saturating_sub(1) / SIZE_CLASS).min(SIZE_CLASSES - 1)
}

pub fn live_blocks() -> Vec<isize> {
    let load = |count: &AtomicIsize| count.load(Ordering::SeqCst);
    LIVE_BLOCKS.iter().map(load).collect()
}

pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::SeqCst)
}

fn count(size: usize, sign: isize) {
    LIVE_BYTES.fetch_add(sign * size as isize, Ordering::Relaxed);
    LIVE_BLOCKS[class_of(size)].fetch_add(sign, Ordering::Relaxed);
}

/// Counts a new block of `size` bytes at `pointer`, unless the allocation failed.
fn counted(pointer: *mut u8, size: usize) -> *mut u8 {
    if !pointer.is_null() {
        count(size, 1);
    }
    pointer
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        count(layout.size(), -1);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            count(layout.size(), -1);
            count(new_size, 1);
        }
        moved
    }
}
